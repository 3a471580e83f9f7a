"""Time the fused-norm GEMMs (``triton_fused.norm_linear``, ``norm_gate_up_silu``) at one
model's shapes over a range of row counts, for A/B runs of two trees in separate processes
(the code under test is whichever ``mmserve`` is on the path).

Usage (GPU): ``python bench/norm_tiles_ab.py --label new --out new.json`` (SmolLM2-135M's
hidden 576, QKV 960, gate/up 2 x 1,536 by default). Each shape: CUDA-event time of
``--iters`` launches after a warm-up, the median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from mmserve.kernels import triton_fused


def _time(fn, iters: int, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / iters)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="run")
    ap.add_argument("--out")
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--qkv", type=int, default=960)
    ap.add_argument("--inter", type=int, default=1536)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256, 2048])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    k = args.hidden
    nw = (torch.randn(k, device=dev) * 0.1 + 1).to(dt)
    w_qkv = (torch.randn(args.qkv, k, device=dev) * k**-0.5).to(dt)
    w_gu = (torch.randn(2 * args.inter, k, device=dev) * k**-0.5).to(dt)
    rows = []
    for m in args.rows:
        x = torch.randn(m, k, device=dev).to(dt)
        qkv = _time(lambda x=x: triton_fused.norm_linear(x, nw, 1e-5, 0.0, w_qkv), args.iters,
                    args.repeats)
        gu = _time(lambda x=x: triton_fused.norm_gate_up_silu(x, nw, 1e-5, 0.0, w_gu), args.iters,
                   args.repeats)
        rows.append({"rows": m, "qkv_us": qkv, "gate_up_us": gu})
        print(f"{args.label} rows {m:5d}  qkv {qkv:8.2f} us  gate_up {gu:8.2f} us", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"label": args.label, "hidden": k, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
