"""What a GEMM phase of the decode stack gains if its weights are already on chip when the
grid barrier before it opens (session 28's lead 1, priced in registers instead of shared
memory, outside the 255-register stack).

The stack's o product (batch 1: a 16-row tile, row 0 in use, K = 576, 36 tiles of 16
columns on a 96-program grid) waits, after the barrier, for its first stage's round trip
(activation row and weights together), then runs 9 pipelined K steps. Here one persistent
kernel runs R rounds of two phases on P programs, as the stack does: phase 1, the first K /
16 programs write the round's activation row (from the last round's output, so the rounds
are a chain and a stale read moves every later value); a grid barrier; phase 2, the
product tile by tile; a grid barrier. The product three ways (``MODE``):

0. the stack's: ``triton_fused._tile_products`` after the barrier (a ``tl.range`` loop of
   K steps of 64, activation and weight tiles pipelined ``STAGES`` deep);
1. every K step's weight tile loaded into registers before the barrier (a tuple of K / 64
   tiles, asked for before the program's phase-1 work), the activation's K steps all asked
   for at once after it, the K steps unrolled;
2. as 1 with the weights asked for after the barrier (what unrolling alone does).

All three chain the same k16 products in the same order, so their outputs must be equal
(checked). Per round: the kernel's time / R, against mode 0's, alternated.

Usage (GPU): ``PYTHONPATH=$PWD python bench/weights_across_barrier.py --out $OUT/w.json``
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from mmserve.bench.limits import cuda_time_ms
from mmserve.kernels.triton_fused import _tile_products
from mmserve.kernels.triton_grid import grid_sync

BM = 16
BN = 16
BK = 64


@triton.jit
def _unrolled(a_rows, ws, row_ok, STEPS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr):
    """The K steps unrolled, step i's weight tile ``ws[i]``; the row's K steps all asked for
    first (else each step's load waits behind the last step's operand barriers: one round
    trip a step)."""
    rk = tl.arange(0, BK)
    rows = ()
    for i in tl.static_range(STEPS):
        rows = rows + (tl.load(a_rows + (i * BK + rk)[None, :], mask=row_ok[:, None],
                               other=0.0, cache_modifier=".cg"),)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for i in tl.static_range(STEPS):
        acc = tl.dot(rows[i], tl.trans(ws[i]), acc)
    return acc


@triton.jit
def _weight_tiles(w_rows, ok, STEPS: tl.constexpr, BK: tl.constexpr):
    """Every K step's (BN, BK) weight tile, as a tuple (zeros where not ``ok``)."""
    rk = tl.arange(0, BK)
    ws = ()
    for i in tl.static_range(STEPS):
        ws = ws + (tl.load(w_rows + (i * BK + rk)[None, :], mask=ok[:, None], other=0.0),)
    return ws


@triton.jit
def _probe_kernel(a_ptr, w_ptr, out_ptr, counter_ptr, R, K: tl.constexpr, N: tl.constexpr,
                  P: tl.constexpr, MODE: tl.constexpr, STAGES: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    STEPS: tl.constexpr = K // BK
    TILES: tl.constexpr = N // BN
    rm = tl.arange(0, BM)
    rn = pid * BN + tl.arange(0, BN)
    row_ok = rm < 1
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    phase = 0
    for r in range(R):
        a_r = a_ptr + r * K  # the round's own row buffer, as the stack's are a layer's
        if MODE == 1:  # the weights asked for before the phase's barrier
            ws = _weight_tiles(w_rows, rn < N, STEPS, BK)
        if pid < K // 16:  # phase 1: the round's row from the last round's output
            c = pid * 16 + tl.arange(0, 16)
            prev = tl.load(out_ptr + r * N + c % N, cache_modifier=".cg").to(tl.float32)
            tl.store(a_r + c, (prev * 0.5 + 1.0).to(a_ptr.dtype.element_ty))
        phase += 1
        grid_sync(counter_ptr, phase, P)
        if pid < TILES:  # phase 2: out = row @ W.T, tile pid
            a_rows = a_r + rm.to(tl.int64)[:, None] * 0
            if MODE == 0:
                acc, _ = _tile_products(a_rows, w_rows, w_rows, row_ok, rn, N, K, w_ptr, 0.0,
                                        False, False, BM, BN, BK, ".cg", STAGES)
            elif MODE == 1:
                acc = _unrolled(a_rows, ws, row_ok, STEPS, BM, BN, BK)
            else:
                acc = _unrolled(a_rows, _weight_tiles(w_rows, rn < N, STEPS, BK), row_ok, STEPS,
                                BM, BN, BK)
            tl.store(out_ptr + (r + 1) * N + rn[None, :] + rm[:, None] * 0,
                     acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        phase += 1
        grid_sync(counter_ptr, phase, P)


def run(mode: int, w: torch.Tensor, rounds: int, programs: int, stages: int):
    """One launch of ``rounds`` rounds -> (its output rows, a function that relaunches it)."""
    n, k = w.shape
    a = torch.zeros(rounds, k, dtype=w.dtype, device=w.device)
    out = torch.zeros(rounds + 1, n, dtype=w.dtype, device=w.device)
    out[0] = torch.linspace(-1, 1, n, device=w.device).to(w.dtype)
    counter = torch.zeros(1, dtype=torch.int32, device=w.device)

    def launch() -> None:
        counter.zero_()
        _probe_kernel[(programs,)](a, w, out, counter, rounds, K=k, N=n, P=programs, MODE=mode,
                                   STAGES=stages, BM=BM, BN=BN, BK=BK, num_warps=4,
                                   num_stages=4)
    launch()
    torch.cuda.synchronize()
    return out.clone(), launch


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="576x576,960x576,576x1536",
                    help="N x K products (o, QKV, down of SmolLM2-135M)")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--programs", type=int, default=96)
    ap.add_argument("--stages", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default="weights_across_barrier.json")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    report: dict = {"rounds": args.rounds, "programs": args.programs, "stages": args.stages,
                    "shapes": {}}
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = (torch.randn(n, k, device="cuda", generator=gen) * k**-0.5).to(torch.bfloat16)
        outs, launches = {}, {}
        for mode in (0, 1, 2):
            outs[mode], launches[mode] = run(mode, w, args.rounds, args.programs, args.stages)
        times: dict[int, list[float]] = {0: [], 1: [], 2: []}
        for _ in range(args.pairs):
            for mode in (0, 1, 2):
                times[mode].append(cuda_time_ms(launches[mode], repeats=20) * 1e3 / args.rounds)
        row = {f"mode{m}_us_a_round": statistics.median(t) for m, t in times.items()}
        row["same_bits"] = {m: bool(torch.equal(outs[m], outs[0])) for m in (1, 2)}
        row["last_row_finite"] = bool(torch.isfinite(outs[0][-1].float()).all())
        report["shapes"][shape] = row
        print(f"{shape}: a round {row['mode0_us_a_round']:.2f} us (the stack's loop), "
              f"{row['mode1_us_a_round']:.2f} (weights in registers before the barrier), "
              f"{row['mode2_us_a_round']:.2f} (unrolled, weights after it); same bits "
              f"{row['same_bits']}", flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
