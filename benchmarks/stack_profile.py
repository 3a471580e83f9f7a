"""Where a batch-1 step of the one-launch decode stack goes (GPU).

Every program stamps its SM clock when its work in a phase is done and when it leaves
the barrier after it (``decode_stack(..., timing=...)``). SMs count at one rate from
different origins, and every program leaves a barrier within a poll of the others, so
each program's clock is aligned to program 0's by the median offset of its barrier exits.
Per phase kind (over layers, median): the critical path (the last program's work done,
from the last barrier's exit), the barrier itself (from that last arrival to the exit),
program 0's own work, and which programs arrive last. Then the whole step: the stack's
graph replayed alone against the engine's batch-1 graph step (embedding, final norm, LM
head and argmax on top).

Usage (GPU): ``PYTHONPATH=$PWD python benchmarks/stack_profile.py --ctx 120 250 --out $OUT/p.json
[--variant 'static={"static": true}' ...]`` (each variant's ``StackTuning`` changes, and
"_split" for ``triton_attention.SPLIT`` and "_serial" for ``cuda_graphs.SERIAL_MAX_SPLITS``,
alternated with the default in rounds, outputs compared bit for bit, the largest difference
reported where they differ); ``--launches-only`` just
launches the stack (for ``ncu -k regex:decode_stack``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics

import torch

from mmserve.bench.engine_run import prompted_decoder
from mmserve.bench.limits import cuda_time_ms
from mmserve.engine import cuda_graphs
from mmserve.engine.cuda_graphs import serial_max_keys
from mmserve.kernels import settings as kernel_settings
from mmserve.kernels import triton_attention
from mmserve.kernels.attention import AttentionMetadata
from mmserve.kernels.decode_stack import serial_splits, stacked_weights
from mmserve.kernels.triton_attention import paged_metadata
from mmserve.kernels.triton_decode_stack import decode_stack, default_programs

PHASES = ("qkv", "attention", "o", "gate_up", "down")


def stack_launcher(model, dec, ctx: int, timing: torch.Tensor | None):
    """A function launching the stack for one decode token at position ``ctx - 1``."""
    table = [int(b) for b in dec.tables[0]]
    meta = paged_metadata(AttentionMetadata.build([1], [ctx], [table], 16, dec.device), 16)
    x = model.embed(torch.tensor([7], device=dec.device))
    pos = torch.tensor([ctx - 1], device=dec.device)
    weights = stacked_weights(model.layers)

    def launch() -> torch.Tensor:
        return decode_stack(
            x,
            weights,
            dec.kv,
            model.rope.cos,
            model.rope.sin,
            pos,
            meta.slot_mapping,
            meta.block_tables,
            meta.context_lens,
            meta.query_start,
            meta.query_lens,
            1,
            heads=model.num_heads,
            kv_heads=model.num_kv_heads,
            eps=model.eps,
            scale=model.head_dim**-0.5,
            timing=timing,
        )

    return launch


def phase_table(t: torch.Tensor, n_layers: int) -> dict:
    """(programs, 4 + 10 L) stamps -> per phase kind: critical path, barrier, program 0's
    work (us, medians over layers) and the programs that arrive last; the SM clock's rate
    from program 0's global-timer stamps."""
    ns = (t[0, 3 + 10 * n_layers] - t[0, 2 + 10 * n_layers]).item()
    cyc = t[:, : 2 + 10 * n_layers].double()
    us_per_cycle = ns * 1e-3 / (cyc[0, 1 + 10 * n_layers] - cyc[0, 1]).item()
    done = cyc[:, 0 : 10 * n_layers : 2]  # (P, 5 L): phase i's work done (slot 2 i)
    left = cyc[:, 3 : 2 + 10 * n_layers : 2]  # (P, 5 L): the barrier after phase i left
    offset = (left - left[:1]).median(dim=1).values  # each program's clock origin vs 0's
    done = done - offset[:, None]
    left = left - offset[:, None]
    start = torch.cat([cyc[0, 1:2], left[0, :-1]])  # phase i's start (program 0's clock)
    last = done.max(dim=0)
    out: dict = {"sm_mhz": 1 / us_per_cycle, "stamped_us": ns * 1e-3}
    for i, name in enumerate(PHASES):
        idx = list(range(i, 5 * n_layers, 5))
        crit = [(last.values[j] - start[j]).item() * us_per_cycle for j in idx]
        bar = [(left[0, j] - last.values[j]).item() * us_per_cycle for j in idx]
        own = [(done[0, j] - start[j]).item() * us_per_cycle for j in idx]
        laggards = [int(last.indices[j]) for j in idx]
        out[name] = {
            "critical_us": statistics.median(crit),
            "barrier_us": statistics.median(bar),
            "program0_us": statistics.median(own),
            "laggards": sorted(set(laggards), key=laggards.count, reverse=True)[:6],
        }
    layer = [
        (left[0, 5 * (k + 1) - 1] - left[0, 5 * k - 1]).item() * us_per_cycle
        for k in range(1, n_layers)
    ]
    out["layer_us"] = statistics.median(layer)
    return out


def graph_us(fn, repeats: int = 200) -> float:
    """Median replay time of ``fn`` captured in a CUDA graph (us)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return cuda_time_ms(g.replay, repeats=repeats) * 1e3


def profile_row(model, dec, ctx: int, programs: int) -> dict:
    """One stack launch's phase table at ``ctx`` cached tokens (warm), its graph replay
    time and its output (for the bitwise check between settings)."""
    n_layers = model.num_layers
    serial = ctx <= serial_max_keys(model.head_dim)
    with serial_splits() if serial else contextlib.nullcontext():
        timing = torch.zeros(programs, 4 + 10 * n_layers, dtype=torch.int64, device=dec.device)
        timed = stack_launcher(model, dec, ctx, timing)
        for _ in range(10):
            timed()
        torch.cuda.synchronize()
        timing.zero_()
        cuda_time_ms(timed, repeats=1)  # warm launches; the last one's stamps stay
        row = phase_table(timing.cpu(), n_layers)
        plain = stack_launcher(model, dec, ctx, None)
        row["stack_graph_us"] = graph_us(plain)
        row["out"] = plain().float().cpu()
    row["serial"] = serial
    return row


def show(name: str, ctx: int, row: dict) -> None:
    print(
        f"[{name}] ctx {ctx}: stack graph {row['stack_graph_us']:.1f} us (stamped "
        f"{row['stamped_us']:.1f} at {row['sm_mhz']:.0f} MHz), layer {row['layer_us']:.2f} us",
        flush=True,
    )
    for phase in PHASES:
        r = row[phase]
        print(
            f"  {phase:10s} critical {r['critical_us']:5.2f}  barrier {r['barrier_us']:5.2f}"
            f"  program 0 {r['program0_us']:5.2f}  last {r['laggards']}",
            flush=True,
        )


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--ctx", type=int, nargs="+", default=[120, 250])
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=JSON: settings.StackTuning changes, timed against the "
        "default in alternated rounds, outputs compared bit for bit",
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--launches-only", action="store_true")
    ap.add_argument("--no-engine", action="store_true")
    ap.add_argument("--out", default="stack_profile.json")
    args = ap.parse_args()
    dec, first, _ = prompted_decoder(args.model, 1024)
    model = dec.model
    programs = default_programs(stacked_weights(model.layers), model.num_kv_heads, dec.device)
    if args.launches_only:
        for ctx in args.ctx:
            serial = (
                serial_splits()
                if ctx <= serial_max_keys(model.head_dim)
                else contextlib.nullcontext()
            )
            with serial:
                launch = stack_launcher(model, dec, ctx, None)
                for _ in range(6):
                    launch()
        torch.cuda.synchronize()
        return
    arith = {
        "_split": (triton_attention, "SPLIT"),
        "_serial": (cuda_graphs, "SERIAL_MAX_SPLITS"),
        "_bn": (triton_attention, "BLOCK_N"),
    }
    arith_base = {k: getattr(mod, attr) for k, (mod, attr) in arith.items()}
    settings = {"default": {}}
    for v in args.variant:
        name, _, js = v.partition("=")
        settings[name] = json.loads(js)
    report: dict = {"model": args.model, "programs": programs, "rows": []}
    ref: dict = {}
    for rnd in range(args.rounds):
        for name, over in settings.items():
            stack = {k: v for k, v in over.items() if k not in arith}
            for k, (mod, attr) in arith.items():  # "_split": keys a split (the bits move)
                setattr(mod, attr, over.get(k, arith_base[k]))  # "_serial": its graph's splits
            for ctx in args.ctx:
                with kernel_settings.override(stack=stack):
                    row = profile_row(model, dec, ctx, programs)
                out = row.pop("out")
                ref.setdefault(ctx, out)
                row["same_bits_as_default"] = bool(torch.equal(out, ref[ctx]))
                row["max_abs_diff"] = float((out - ref[ctx]).abs().max())
                row.update(setting=name, ctx=ctx, round=rnd)
                report["rows"].append(row)
                show(name, ctx, row)
                if not row["same_bits_as_default"]:
                    print(
                        f"  !! {name} ctx {ctx}: output differs from the default's (max abs "
                        f"{row['max_abs_diff']:.3g}, scale {float(ref[ctx].abs().max()):.3g})",
                        flush=True,
                    )
    for k, (mod, attr) in arith.items():
        setattr(mod, attr, arith_base[k])
    print("summary (stack graph us, median over rounds):")
    for name in settings:
        for ctx in args.ctx:
            us = [
                r["stack_graph_us"]
                for r in report["rows"]
                if r["setting"] == name and r["ctx"] == ctx
            ]
            same = all(r["same_bits_as_default"] for r in report["rows"] if r["setting"] == name)
            print(f"  {name:14s} ctx {ctx:4d}: {statistics.median(us):7.1f}  same bits: {same}")
    if not args.no_engine:
        step_ms, _ = dec.recaptured_step_ms(first)
        report["engine_step_us_ctx128_256"] = step_ms * 1e3
        print(
            f"engine batch-1 graph step (ahead, ctx 129-228): {step_ms * 1e3:.1f} us "
            f"({1e3 / step_ms:.0f} tok/s)",
            flush=True,
        )
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
