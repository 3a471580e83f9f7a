"""The LM head alone at batch 1: the bf16 weight's GEMM against the Q8_0 blocks'
(``triton_matmul.q8_linear``) per tile, and their bits.

In the engine's step the decode stack streams ~200 MB of layer weights between two heads,
so the head's weights are never in L2 when it starts; the blocks (31.8 MB at SmolLM2-135M)
would fit in the H200's 50 MB L2 if one call followed another. So each timed graph runs
``--calls`` heads in a row, each on its own copy of the weights (copies enough for twice
the L2 between two uses of one), and the time is the graph's replay over the calls.
Rounds alternate the variants (odd rounds reversed); the figure is the median.

Usage (GPU): ``PYTHONPATH=$PWD python bench/lm_head_q8.py --out $OUT/lm_head_q8.json``
[``--shapes 49152x576 262144x640``] [``--rounds 3``] [``--rows 1``]
[``--tiles 16x256x32x4x6 ...``] (``--rows`` above 16: the 64-row tiles, for a wider
``Q8_MAX_ROWS``)
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from mmserve.bench.limits import graph_replay_seconds
from mmserve.kernels.q8 import quantize_q8
from mmserve.kernels.triton_matmul import (
    Q8_TILE_FEW,
    Q8_TILE_MANY,
    TileConfig,
    invariant_linear,
    q8_linear,
)

L2_BYTES = 50 << 20  # the H200's
T = TileConfig
# Q8_0 tiles to try (bk is the block, 32): q8_tile's two first
Q8_TILES = [Q8_TILE_MANY, Q8_TILE_FEW, T(16, 64, 32, 4, 8), T(16, 128, 32, 8, 8),
            T(16, 256, 32, 8, 6), T(16, 128, 32, 4, 12), T(16, 64, 32, 2, 8),
            T(16, 32, 32, 2, 8), T(16, 64, 32, 4, 12)]
# for 17-64 rows (batch 32-64 decode: the bf16 head still streams 56.6 MB a step there;
# triton_matmul.Q8_MAX_ROWS is 16 until these are measured)
Q8_TILES_WIDE = [T(64, 128, 32, 4, 6), T(64, 64, 32, 4, 8), T(32, 128, 32, 4, 8),
                 T(64, 128, 32, 8, 6)]


def _copies(nbytes: int) -> int:
    return max(2, -(-2 * L2_BYTES // nbytes) + 1)


def measure_shape(n: int, k: int, rows: int, rounds: int, calls: int,
                  tiles: list[TileConfig] | None = None) -> dict:
    """Every variant's µs a call at (rows, k) x (n, k), and whether its bits are bf16's."""
    torch.manual_seed(n + k)
    w8 = quantize_q8(torch.randn(n, k, device="cuda") / k**0.5)
    w = w8.dequantize(torch.bfloat16)
    x = torch.randn(rows, k, device="cuda").bfloat16()
    want = invariant_linear(x, w, float_out=True)
    q8_bytes = w8.q.numel() + w8.scale.numel() * 4
    ws = [w] + [w.clone() for _ in range(_copies(w.numel() * 2) - 1)]
    w8s = [w8] + [type(w8)(w8.q.clone(), w8.scale.clone()) for _ in range(_copies(q8_bytes) - 1)]
    variants = {"bf16": (lambda i: invariant_linear(x, ws[i % len(ws)], float_out=True),
                         w.numel() * 2)}
    for cfg in tiles or (Q8_TILES if rows <= 16 else Q8_TILES_WIDE):
        variants["q8 " + "x".join(str(v) for v in cfg)] = (
            lambda i, c=cfg: q8_linear(x, w8s[i % len(w8s)], config=c, float_out=True), q8_bytes)
    bits = {name: bool(torch.equal(fn(0), want)) for name, (fn, _) in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rnd in range(rounds):
        order = list(variants.items())
        for name, (fn, _) in order if rnd % 2 == 0 else order[::-1]:
            sec = graph_replay_seconds(lambda f=fn: [f(i) for i in range(calls)], reps=10)
            times[name].append(sec / calls * 1e6)
    out = {}
    for name, (_, nbytes) in variants.items():
        us = statistics.median(times[name])
        out[name] = {"us": us, "us_rounds": times[name], "bytes": nbytes,
                     "tb_s": nbytes / us / 1e6, "bits_equal_bf16": bits[name]}
        print(f"{n}x{k} rows={rows} {name:24s} {us:7.2f} us  {nbytes / us / 1e6:5.2f} TB/s  "
              f"bits {'equal' if bits[name] else 'DIFFER'}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["49152x576", "262144x640"])
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--tiles", nargs="+", default=None,
                    help="Q8_0 tiles to time, BMxBNx32xWARPSxSTAGES (default: the lists above)")
    ap.add_argument("--out", default="lm_head_q8.json")
    args = ap.parse_args()
    report: dict = {"rows": args.rows, "calls": args.calls, "shapes": {}}
    for spec in args.shapes:
        n, k = (int(v) for v in spec.split("x"))
        tiles = [T(*(int(v) for v in t.split("x"))) for t in args.tiles or []]
        report["shapes"][spec] = measure_shape(n, k, args.rows, args.rounds, args.calls, tiles)
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
