"""What a batch-1 engine decode step holds besides the decode stack (GPU).

The engine's batch-1 graph step (``PagedDecoder.decode(..., ahead=True)``, as the
throughput bench runs it) is traced with the PyTorch profiler (CUPTI): every kernel and
copy on the device, in order. Per step (from one decode stack's start to the next's): the
stack's own time, every other operation's, and the idle time between them, as medians over
the traced steps. The untraced step time (the bench's number) is printed beside it.

Usage (GPU): ``PYTHONPATH=$PWD python bench/step_trace.py [--model smollm2-135m]
[--steps 40] [--start 128] [--tuning '{"poll": null}'] [--q8-head] [--out trace.json]``:
``--start`` the position the traced steps start from (512: the graphs of the spread
attention), ``--tuning`` ``triton_decode_stack.TUNING`` overrides for the whole run,
``--q8-head`` the LM head read from Q8_0 blocks (the engine's default for the GGUFs).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from mmserve.bench.engine_run import prompted_decoder, tuning_overrides
from mmserve.kernels.triton_decode_stack import TUNING

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def device_events(trace: dict) -> list[dict]:
    """The trace's device operations (kernels, copies, memsets), by start time."""
    ev = [e for e in trace["traceEvents"] if e.get("cat") in DEVICE_CATS and "dur" in e]
    return sorted(ev, key=lambda e: e["ts"])


def short(name: str) -> str:
    """A kernel's name without its template arguments (Triton names are already short)."""
    return name.split("<")[0].split("(")[0][:60]


def per_step(ev: list[dict], anchor: str) -> list[list[dict]]:
    """The events split into steps, each starting at an ``anchor`` kernel."""
    steps: list[list[dict]] = []
    for e in ev:
        if anchor in e["name"]:
            steps.append([])
        if steps:
            steps[-1].append(e)
    return steps[1:-1]  # whole steps only (the first and last may be cut by the window)


def summarize(steps: list[list[dict]], nxt_start: list[float]) -> dict:
    """Per step: each operation's duration, the idle gaps, the step's span (us)."""
    ops: dict[str, list[float]] = collections.defaultdict(list)
    gaps: dict[str, list[float]] = collections.defaultdict(list)
    spans, idle = [], []
    for s, end in zip(steps, nxt_start, strict=True):
        t0 = s[0]["ts"]
        spans.append(end - t0)
        tot_idle = 0.0
        counts: collections.Counter = collections.Counter()
        for i, e in enumerate(s):
            key = f"{short(e['name'])}#{counts[short(e['name'])]}"
            counts[short(e['name'])] += 1
            ops[key].append(e["dur"])
            stop = e["ts"] + e["dur"]
            nxt = s[i + 1]["ts"] if i + 1 < len(s) else end
            gaps[f"after {key}"].append(max(0.0, nxt - stop))
            tot_idle += max(0.0, nxt - stop)
        idle.append(tot_idle)
    med = {k: statistics.median(v) for k, v in ops.items()}
    return {"span_us": statistics.median(spans), "idle_us": statistics.median(idle),
            "ops_us": med, "gaps_us": {k: statistics.median(v) for k, v in gaps.items()},
            "steps": len(spans)}


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--start", type=int, default=128)
    ap.add_argument("--tuning", default="{}", help="JSON: triton_decode_stack.TUNING overrides")
    ap.add_argument("--out", default="step_trace.json")
    ap.add_argument("--q8-head", action="store_true",
                    help="the LM head's weight as Q8_0 blocks (as the shipped GGUFs store it)")
    args = ap.parse_args()
    over = tuning_overrides(args.tuning)
    TUNING.update(over)
    dec, first, _ = prompted_decoder(args.model, max(1024, args.start + args.steps + 64),
                                     q8_head=args.q8_head)
    plain_ms, _ = dec.recaptured_step_ms(first)  # captures the batch-1 graphs
    print(f"[{args.model}] untraced ahead step {plain_ms * 1e3:.1f} us at 128 "
          f"({1e3 / plain_ms:.0f} tok/s); tuning {over}", flush=True)
    dec.decode(first, args.start, 5, graphs=True, ahead=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        r = dec.decode(first, args.start, args.steps, graphs=True, ahead=True)
    path = args.out + ".chrome.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        ev = device_events(json.load(f))
    names = collections.Counter(short(e["name"]) for e in ev)
    anchor = next((n for n in names if "decode_stack" in n), None)
    if anchor is None:  # no stack (a shape it does not run): the step's embedding kernel
        anchor = min(names, key=lambda n: abs(names[n] - args.steps - 3))
    steps = per_step(ev, anchor)
    nxt = [st[0]["ts"] for st in steps[1:]] + [steps[-1][-1]["ts"] + steps[-1][-1]["dur"]]
    rep = summarize(steps[:-1], nxt[:-1])
    rep.update(model=args.model, start=args.start, tuning=over, anchor=anchor,
               traced_step_ms=r.seconds / r.steps * 1e3,
               untraced_step_ms=plain_ms, ops_per_step=len(steps[0]))
    print(f"traced step {rep['traced_step_ms'] * 1e3:.1f} us; device span {rep['span_us']:.1f} us"
          f" over {rep['steps']} steps, idle {rep['idle_us']:.1f} us", flush=True)
    for k, v in rep["ops_us"].items():
        print(f"  {v:8.1f} us  {k:60s} gap after {rep['gaps_us']['after ' + k]:6.1f}")
    with open(args.out, "w") as f:
        json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
