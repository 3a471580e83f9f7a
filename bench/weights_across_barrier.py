"""What a GEMM phase of the decode stack gains if its weights are already on chip when the
grid barrier before it opens (session 28's lead 1, priced outside the 255-register stack,
in Triton registers and in Gluon shared memory).

The stack's o product (batch 1: a 16-row tile, row 0 in use, K = 576, 36 tiles of 16
columns on a 96-program grid) waits, after the barrier, for its first stage's round trip
(activation row and weights together), then runs 9 pipelined K steps. Here one persistent
kernel runs R rounds of two phases on P programs, as the stack does: phase 1, the first K /
16 programs write the round's activation row (from the last round's output, so the rounds
are a chain and a stale read moves every later value); a grid barrier; phase 2, the
product tile by tile; a grid barrier. The product six ways (``MODE``):

0. the stack's: ``triton_fused._tile_products`` after the barrier (a ``tl.range`` loop of
   K steps of 64, activation and weight tiles pipelined ``STAGES`` deep);
1. every K step's weight tile loaded into registers before the barrier (a tuple of K / 64
   tiles, asked for before the program's phase-1 work), the activation's K steps all asked
   for at once after it, the K steps unrolled;
2. as 1 with the weights asked for after the barrier (what unrolling alone does);
3. Gluon: every K step's weight tile copied into shared memory before the barrier, the
   row's after it, the steps unrolled from shared memory into ``mma.sync``;
4. as 3 with the weights copied after the barrier;
5. as 3 in four chains summed in a fixed order (other bits: the chain's latency).

Modes 0-4 chain the same k16 products in the same order, so their outputs must be equal
(checked). Per round: the kernel's time / R, the modes alternated.

Usage (GPU): ``PYTHONPATH=$PWD python bench/weights_across_barrier.py --out $OUT/w.json``
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from mmserve.bench.limits import cuda_time_ms
from mmserve.kernels.triton_fused import _tile_products
from mmserve.kernels.triton_grid import grid_sync

BM = 16
BN = 16
BK = 64
MODES = (0, 1, 2, 3, 4, 5)


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


@gluon.jit
def _gl_grid_sync(counter_ptr, phase, programs):
    """``triton_grid.grid_sync`` in Gluon (a Gluon kernel cannot call a Triton function)."""
    gl.thread_barrier()
    gl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    target = phase * programs
    seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()


@gluon.jit
def _gluon_kernel(a_ptr, w_ptr, out_ptr, counter_ptr, R, K: gl.constexpr, N: gl.constexpr,
                  P: gl.constexpr, MODE: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  BK: gl.constexpr):
    """Mode 3 (the weights' copies into shared memory issued before the barrier) and 4
    (after it): every K step's weight and row tiles copied (cp.async) into
    shared memory, the K steps unrolled from there into ``mma.sync`` with no other layout
    conversion. The same chain of k16 products as modes 0-2. Mode 5: as 3 with the K steps
    in four chains (step i in chain i % 4) summed in a fixed order: other bits (a probe of
    the chain's latency, which the stack's arithmetic does not allow)."""
    STEPS: gl.constexpr = K // BK
    TILES: gl.constexpr = N // BN
    EARLY: gl.constexpr = MODE != 4  # the weights copied before the barrier
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4],
                                                  instr_shape=[16, 8])
    dot_a: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    dot_b: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    w_smem = ()  # a buffer a K step (one allocation each: no barrier between the copies)
    a_smem = ()
    for _ in gl.static_range(STEPS):
        w_smem = w_smem + (gl.allocate_shared_memory(gl.bfloat16, [BN, BK], shared),)
        a_smem = a_smem + (gl.allocate_shared_memory(gl.bfloat16, [BM, BK], shared),)
    pid = gl.program_id(0)
    rm = gl.arange(0, BM, gl.SliceLayout(1, blocked))
    rn = pid * BN + gl.arange(0, BN, gl.SliceLayout(1, blocked))
    rk = gl.arange(0, BK, gl.SliceLayout(0, blocked))
    w_tile = w_ptr + rn.to(gl.int64)[:, None] * K + rk[None, :]
    w_ok = (rn < N)[:, None] & (rk < BK)[None, :]
    a_ok = (rm < 1)[:, None] & (rk < BK)[None, :]
    om = gl.arange(0, BM, gl.SliceLayout(1, mma))
    on = pid * BN + gl.arange(0, BN, gl.SliceLayout(0, mma))
    ones = gl.arange(0, 16, gl.SliceLayout(0, blocked))
    phase = 0
    for r in range(R):
        a_r = a_ptr + r * K
        if EARLY:
            for i in gl.static_range(STEPS):
                gl.nvidia.ampere.async_copy.async_copy_global_to_shared(
                    w_smem[i], w_tile + i * BK, mask=w_ok)
            gl.nvidia.ampere.async_copy.commit_group()
        if pid < K // 16:  # phase 1: the round's row from the last round's output
            c = pid * 16 + ones
            prev = gl.load(out_ptr + r * N + c % N, cache_modifier=".cg").to(gl.float32)
            gl.store(a_r + c, (prev * 0.5 + 1.0).to(gl.bfloat16))
        phase += 1
        _gl_grid_sync(counter_ptr, phase, P)
        if pid < TILES:
            if not EARLY:
                for i in gl.static_range(STEPS):
                    gl.nvidia.ampere.async_copy.async_copy_global_to_shared(
                        w_smem[i], w_tile + i * BK, mask=w_ok)
            for i in gl.static_range(STEPS):
                gl.nvidia.ampere.async_copy.async_copy_global_to_shared(
                    a_smem[i], a_r + rm[:, None] * 0 + (i * BK + rk)[None, :], mask=a_ok,
                    cache_modifier=".cg")
            gl.nvidia.ampere.async_copy.commit_group()
            gl.nvidia.ampere.async_copy.wait_group(0)
            gl.thread_barrier()
            if MODE == 5:  # four chains (step i in chain i % 4), summed in a fixed order
                c0 = gl.zeros([BM, BN], gl.float32, mma)
                c1 = gl.zeros([BM, BN], gl.float32, mma)
                c2 = gl.zeros([BM, BN], gl.float32, mma)
                c3 = gl.zeros([BM, BN], gl.float32, mma)
                for i in gl.static_range(STEPS):
                    a = a_smem[i].load(dot_a)
                    b = w_smem[i].permute([1, 0]).load(dot_b)
                    if i % 4 == 0:
                        c0 = gl.nvidia.ampere.mma_v2(a, b, c0)
                    elif i % 4 == 1:
                        c1 = gl.nvidia.ampere.mma_v2(a, b, c1)
                    elif i % 4 == 2:
                        c2 = gl.nvidia.ampere.mma_v2(a, b, c2)
                    else:
                        c3 = gl.nvidia.ampere.mma_v2(a, b, c3)
                acc = (c0 + c1) + (c2 + c3)
            else:
                acc = gl.zeros([BM, BN], gl.float32, mma)
                for i in gl.static_range(STEPS):
                    a = a_smem[i].load(dot_a)
                    b = w_smem[i].permute([1, 0]).load(dot_b)
                    acc = gl.nvidia.ampere.mma_v2(a, b, acc)
            gl.store(out_ptr + (r + 1) * N + om[:, None] * 0 + on[None, :],
                     acc.to(gl.bfloat16), mask=(om < 1)[:, None] & (on < N)[None, :])
        else:
            gl.nvidia.ampere.async_copy.wait_group(0)
        phase += 1
        _gl_grid_sync(counter_ptr, phase, P)


def run(mode: int, w: torch.Tensor, rounds: int, programs: int, stages: int):
    """One launch of ``rounds`` rounds -> (its output rows, a function that relaunches it)."""
    n, k = w.shape
    a = torch.zeros(rounds, k, dtype=w.dtype, device=w.device)
    out = torch.zeros(rounds + 1, n, dtype=w.dtype, device=w.device)
    out[0] = torch.linspace(-1, 1, n, device=w.device).to(w.dtype)
    counter = torch.zeros(1, dtype=torch.int32, device=w.device)

    def launch() -> None:
        counter.zero_()
        if mode >= 3:
            _gluon_kernel[(programs,)](a, w, out, counter, rounds, K=k, N=n, P=programs,
                                       MODE=mode, BM=BM, BN=BN, BK=BK, num_warps=4)
        else:
            _probe_kernel[(programs,)](a, w, out, counter, rounds, K=k, N=n, P=programs,
                                       MODE=mode, STAGES=stages, BM=BM, BN=BN, BK=BK,
                                       num_warps=4, num_stages=4)
    launch()
    torch.cuda.synchronize()
    return out.clone(), launch


def rounds_args(out: str) -> argparse.ArgumentParser:
    """The options of the round benches (this one and ``handoff_gemm.py``)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="576x576,960x576,576x1536",
                    help="N x K products (o, QKV, down of SmolLM2-135M)")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--programs", type=int, default=96)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default=out)
    return ap


def shape_weights(shapes: str):
    """Each "NxK" of ``shapes`` -> (the text, a random (N, K) bf16 weight), seeded."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        yield shape, (torch.randn(n, k, device="cuda", generator=gen) * k**-0.5).to(
            torch.bfloat16)


def alternated_us(launches: dict, pairs: int, rounds: int) -> dict:
    """Each launch timed ``pairs`` times, the launches in turn -> us a round per launch."""
    times: dict = {key: [] for key in launches}
    for _ in range(pairs):
        for key, launch in launches.items():
            times[key].append(cuda_time_ms(launch, repeats=20) * 1e3 / rounds)
    return times


@torch.inference_mode()
def main() -> None:
    ap = rounds_args("weights_across_barrier.json")
    ap.add_argument("--stages", type=int, default=5)
    args = ap.parse_args()
    report: dict = {"rounds": args.rounds, "programs": args.programs, "stages": args.stages,
                    "shapes": {}}
    for shape, w in shape_weights(args.shapes):
        outs, launches = {}, {}
        for mode in MODES:
            outs[mode], launches[mode] = run(mode, w, args.rounds, args.programs, args.stages)
        times = alternated_us(launches, args.pairs, args.rounds)
        row = {f"mode{m}_us_a_round": statistics.median(t) for m, t in times.items()}
        row["same_bits"] = {m: bool(torch.equal(outs[m], outs[0])) for m in MODES[1:]}
        row["chains_max_diff"] = float((outs[5].float() - outs[0].float()).abs().max())
        row["last_row_finite"] = bool(torch.isfinite(outs[0][-1].float()).all())
        report["shapes"][shape] = row
        print(f"{shape}: a round {row['mode0_us_a_round']:.2f} us (the stack's loop), "
              f"{row['mode1_us_a_round']:.2f} (weights in registers before the barrier), "
              f"{row['mode2_us_a_round']:.2f} (unrolled, weights after it); Gluon: "
              f"{row['mode3_us_a_round']:.2f} (weights to shared memory before the barrier), "
              f"{row['mode4_us_a_round']:.2f} (after it), {row['mode5_us_a_round']:.2f} (before, "
              f"4 chains: other bits, max diff {row['chains_max_diff']:.3g}); same bits "
              f"{row['same_bits']}", flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
