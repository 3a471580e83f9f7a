"""The engine's batch-1 decode step per decode-stack setting, alternated in one process:
the measure to decide a stack setting by.

The stack's graph replayed alone (``stack_profile.py``) is no guide to the engine's step at
a few microseconds: a setting can read faster alone and slower inside the engine's graph,
and settings that each save time need not add (docs/performance.md). This times what
``throughput.py``'s decode runs: per setting and round, the batch-1 graphs are captured
anew, then ``--steps`` greedy steps, each launched from the last one's argmax on the device
before the host reads that step's token (the engine's async scheduling), from each
``--starts`` position. Rounds run the settings in turn, odd rounds in reverse (no setting
always first); the step is the mean over the steps.

Usage (GPU): ``PYTHONPATH=$PWD python benchmarks/step_ab.py --out $OUT/step_ab.json
--variant 'qh_off={"qkv_hoist": false}' [--variant ...] [--starts 128 512]``. Starts 128
give 129-228 cached tokens (the serial graph, as throughput.py's decode); 512, 513-612
(the spread one). ``--q8-head``: the LM head's random weight as Q8_0 blocks (as the shipped
GGUFs store theirs), and a setting may then set ``"q8_head": false`` (the head from its
bf16 weight: ``KernelConfig.q8_head``) or ``"q8_tile": [bm, bn, bk, warps, stages]``
(``KernelConfig.q8_tile``: the head's tile in place of ``q8_tile``'s) beside the stack's
keys (``StackTuning``); ``"spread": false``: ``KernelConfig.spread``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from mmserve.bench.engine_run import prompted_decoder, tuning_overrides
from mmserve.kernels import settings as kernel_settings

EXTRA = {"q8_head", "q8_tile", "spread"}  # KernelConfig's keys, not the stack's
Q8_KEYS = {"q8_head", "q8_tile"}  # those that need --q8-head


def settings_from(variants: list[str]) -> dict[str, dict]:
    """["NAME=JSON", ...] -> {"default": {}, NAME: StackTuning / KernelConfig changes}."""
    out: dict[str, dict] = {"default": {}}
    for v in variants:
        name, _, js = v.partition("=")
        out[name] = tuning_overrides(js, EXTRA, name)
    return out


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=JSON: StackTuning (and q8_head, q8_tile, spread) changes",
    )
    ap.add_argument("--starts", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="step_ab.json")
    ap.add_argument(
        "--q8-head",
        action="store_true",
        help="the LM head's weight as Q8_0 blocks (a setting's q8_head switches it)",
    )
    args = ap.parse_args()
    settings = settings_from(args.variant)
    if not args.q8_head and any(Q8_KEYS & set(over) for over in settings.values()):
        raise SystemExit("q8_head / q8_tile settings need --q8-head (the head's blocks)")
    dec, first, _ = prompted_decoder(
        args.model, max(args.starts) + args.steps + 16, q8_head=args.q8_head
    )
    rows = []
    for rnd in range(args.rounds):
        order = list(settings.items())
        for name, over in order if rnd % 2 == 0 else order[::-1]:
            stack = {k: v for k, v in over.items() if k not in EXTRA}
            extra = {k: v for k, v in over.items() if k in EXTRA}
            with kernel_settings.override(stack=stack, **extra):
                dec.capture((1,))
                row: dict = {"setting": name, "round": rnd}
                for start in args.starts:
                    r = dec.decode(first, start, args.steps, graphs=True, ahead=True)
                    row[f"step_us_{start}"] = r.seconds / r.steps * 1e6
                    row[f"tokens_{start}"] = r.row0
            rows.append(row)
            print(
                json.dumps({k: v for k, v in row.items() if not k.startswith("tokens")}), flush=True
            )
    same = {
        name: all(
            r[f"tokens_{s}"] == rows[0][f"tokens_{s}"]
            for s in args.starts
            for r in rows
            if r["setting"] == name
        )
        for name in settings
    }
    report = {
        "model": args.model,
        "q8_head": args.q8_head,
        "starts": args.starts,
        "steps": args.steps,
        "settings": settings,
        "rows": rows,
        "same_tokens_as_default": same,
    }
    print(
        f"summary: the engine's batch-1 step (us), median of {args.rounds} rounds [each "
        "round's], per start; d: the median of the per-round differences from the default "
        "(the rounds' settings run back to back, so a slow spell of the machine cancels)"
    )
    for name in settings:
        rr = [r for r in rows if r["setting"] == name]
        base = [r for r in rows if r["setting"] == "default"]
        cols = []
        for s in args.starts:
            v = [round(r[f"step_us_{s}"], 1) for r in rr]
            d = [a[f"step_us_{s}"] - b[f"step_us_{s}"] for a, b in zip(rr, base, strict=True)]
            cols.append(f"{s}: {statistics.median(v):6.1f} d {statistics.median(d):+5.1f} {v}")
        print(f"  {name:12s} " + "  ".join(cols) + f"  same tokens: {same[name]}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
