"""A GEMM phase fed by tags in the data instead of grid barriers, in Gluon (session 38).

Session 26 (``bench/handoff.py``) priced tags in the data at -0.26 to -0.33 us a handoff
when the consumer's load of the row is the wait. In the decode stack the consumer is a K
loop whose operand tiles are pipelined loads, and a spin cannot sit in that loop; Gluon can
poll the row once, keep it in shared memory and run the K steps from there. This prices
that, with ``weights_across_barrier.py``'s rounds (one persistent kernel, P programs, R
rounds of: the first K / 16 programs write the round's activation row from the last
round's output; then the product ``out = row @ W.T``, a 16-column tile a program):

- ``barrier``: ``weights_across_barrier``'s Gluon mode 3, a grid barrier after each
  phase (the weights copied into shared memory at the round's start);
- ``tagged``: no barrier. Every 32-bit word of the row and of the output carries its
  value (bf16, high half) and the round's tag (low half). The row's producers spin on
  their 16 words of the last output, and the product's programs spin on the whole row,
  then store it (bf16) into shared memory once, and from there into row 0 of each K
  step's 16-row A tile,
  whose other rows stay zero (the stack's tile at batch 1). So the product is the same
  chain of k16 products as ``barrier``'s, read from shared memory instead of copied
  there.

Both compute the same recurrence, so their outputs must be equal (checked; every tag too).
H100, 96 programs (bench/NOTES.md, session 38): barriers 3.34 / 3.59 / 4.71 us a round at
the o / QKV / down shapes, tagged 4.71 / 5.12 / 10.28, same bits: the tags as built here
lose, the more the longer the row the product's programs spin on.
The tagged buffers are zeroed before each launch and the tags count rounds from 1, so no
stale word can carry a live tag.

Usage (GPU): ``PYTHONPATH=$PWD python bench/handoff_gemm.py --out $OUT/handoff_gemm.json``
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weights_across_barrier import (  # noqa: E402
    BK,
    BM,
    BN,
    alternated_us,
    rounds_args,
    shape_weights,
)
from weights_across_barrier import run as run_barrier


@gluon.jit
def _spin(ptrs, ok, tag):
    """The words at ``ptrs`` (where ``ok``), reloaded (volatile: past L1) until every one carries
    ``tag`` in its low half."""
    w = gl.load(ptrs, mask=ok, other=0, volatile=True)
    stale = gl.sum(gl.where(ok & ((w & 0xFFFF) != tag), 1, 0), axis=0)
    while stale > 0:
        w = gl.load(ptrs, mask=ok, other=0, volatile=True)
        stale = gl.sum(gl.where(ok & ((w & 0xFFFF) != tag), 1, 0), axis=0)
    return w


@gluon.jit
def _spin2(ptrs, ok, tag):
    """``_spin`` for a 2-D block of words."""
    w = gl.load(ptrs, mask=ok, other=0, volatile=True)
    stale = gl.sum(gl.sum(gl.where(ok & ((w & 0xFFFF) != tag), 1, 0), axis=1), axis=0)
    while stale > 0:
        w = gl.load(ptrs, mask=ok, other=0, volatile=True)
        stale = gl.sum(gl.sum(gl.where(ok & ((w & 0xFFFF) != tag), 1, 0), axis=1), axis=0)
    return w


@gluon.jit
def _word(v, tag):
    """bf16 values -> words: the value's bits high, ``tag`` low."""
    return ((v.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF) << 16) | tag


@gluon.jit
def _value(w):
    """Words -> their bf16 values."""
    return (w >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True)


@gluon.jit
def _tagged_kernel(a_ptr, w_ptr, out_ptr, R, K: gl.constexpr, N: gl.constexpr,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, SP: gl.constexpr):
    """R rounds with no barrier: the row's and the output's words carry the round's tag
    (row r and output row r + 1: tag r + 1; the initial output row 0: tag 1)."""
    STEPS: gl.constexpr = K // BK
    TILES: gl.constexpr = N // BN
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4],
                                                  instr_shape=[16, 8])
    dot_a: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    dot_b: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    w_smem = ()
    for _ in gl.static_range(STEPS):
        w_smem = w_smem + (gl.allocate_shared_memory(gl.bfloat16, [BN, BK], shared),)
    # step i's A operand: tile i, row 0 the step's BK values, rows 1-15 zero (as the
    # stack's 16-row tile at batch 1)
    rows = gl.allocate_shared_memory(gl.bfloat16, [SP, BM, BK], plain)
    for i in gl.static_range(SP):
        rows.index(i).store(gl.zeros([BM, BK], gl.bfloat16, blocked))
    stage = gl.allocate_shared_memory(gl.bfloat16, [SP, BK], plain)  # the polled row
    pid = gl.program_id(0)
    rn = pid * BN + gl.arange(0, BN, gl.SliceLayout(1, blocked))
    rk = gl.arange(0, BK, gl.SliceLayout(0, blocked))
    w_tile = w_ptr + rn.to(gl.int64)[:, None] * K + rk[None, :]
    w_ok = (rn < N)[:, None] & (rk < BK)[None, :]
    sr = gl.arange(0, SP, gl.SliceLayout(1, blocked))
    row_off = sr[:, None] * BK + rk[None, :]
    row_ok = (sr < STEPS)[:, None] & (rk < BK)[None, :]
    om = gl.arange(0, BM, gl.SliceLayout(1, mma))
    on = pid * BN + gl.arange(0, BN, gl.SliceLayout(0, mma))
    one = gl.arange(0, 16, gl.SliceLayout(0, blocked))
    for r in range(R):
        tag = r + 1
        if pid < TILES:  # the weights copied at the round's start (as barrier's mode 3)
            for i in gl.static_range(STEPS):
                gl.nvidia.ampere.async_copy.async_copy_global_to_shared(
                    w_smem[i], w_tile + i * BK, mask=w_ok)
            gl.nvidia.ampere.async_copy.commit_group()
        if pid < K // 16:  # phase 1: the round's row from the last round's output
            c = pid * 16 + one
            prev = _value(_spin(out_ptr + r * N + c % N, c >= 0, tag)).to(gl.float32)
            gl.store(a_ptr + r * K + c, _word((prev * 0.5 + 1.0).to(gl.bfloat16), tag))
        if pid < TILES:  # phase 2: the row polled whole, into shared memory once
            words = _spin2(a_ptr + r * K + row_off, row_ok, tag)
            stage.store(_value(words))
            gl.thread_barrier()
            for i in gl.static_range(STEPS):  # each step's values into row 0 of its tile
                rows.index(i).slice(0, 1, dim=0).store(
                    stage.slice(i, 1, dim=0).load(blocked))
            gl.nvidia.ampere.async_copy.wait_group(0)
            gl.thread_barrier()
            acc = gl.zeros([BM, BN], gl.float32, mma)
            for i in gl.static_range(STEPS):
                a = rows.index(i).load(dot_a)
                b = w_smem[i].permute([1, 0]).load(dot_b)
                acc = gl.nvidia.ampere.mma_v2(a, b, acc)
            gl.store(out_ptr + (r + 1) * N + om[:, None] * 0 + on[None, :],
                     _word(acc.to(gl.bfloat16), tag + 1),
                     mask=(om < 1)[:, None] & (on < N)[None, :])
            gl.thread_barrier()  # the buffer's reads done before the next round's store


def run_tagged(w: torch.Tensor, rounds: int, programs: int):
    """One launch of ``rounds`` tagged rounds -> (its output rows as bf16, a relauncher)."""
    n, k = w.shape
    a = torch.zeros(rounds, k, dtype=torch.int32, device=w.device)
    out = torch.zeros(rounds + 1, n, dtype=torch.int32, device=w.device)
    first = torch.linspace(-1, 1, n, device=w.device).to(torch.bfloat16)
    first_words = ((first.view(torch.int16).to(torch.int32) & 0xFFFF) << 16) | 1

    def launch() -> None:
        a.zero_()
        out.zero_()
        out[0] = first_words
        _tagged_kernel[(programs,)](a, w, out, rounds, K=k, N=n, BM=BM, BN=BN, BK=BK,
                                    SP=triton.next_power_of_2(k // BK), num_warps=4)
    launch()
    torch.cuda.synchronize()
    values = (out >> 16).to(torch.int16).view(torch.bfloat16)
    tags = out & 0xFFFF
    tags_ok = bool((tags == torch.arange(1, rounds + 2, device=w.device)[:, None]).all())
    return values.clone(), launch, tags_ok


@torch.inference_mode()
def main() -> None:
    args = rounds_args("handoff_gemm.json").parse_args()
    report: dict = {"device": torch.cuda.get_device_name(0), "rounds": args.rounds,
                    "programs": args.programs, "shapes": {}}
    for shape, w in shape_weights(args.shapes):
        base_out, base_launch = run_barrier(3, w, args.rounds, args.programs, 5)
        tag_out, tag_launch, tags_ok = run_tagged(w, args.rounds, args.programs)
        times = alternated_us({"barrier": base_launch, "tagged": tag_launch}, args.pairs,
                              args.rounds)
        row = {f"{name}_us_a_round": statistics.median(t) for name, t in times.items()}
        row["all_us"] = {name: [round(x, 4) for x in t] for name, t in times.items()}
        row["same_bits"] = bool(torch.equal(tag_out, base_out))
        row["tags_ok"] = tags_ok
        report["shapes"][shape] = row
        print(f"{shape}: a round {row['barrier_us_a_round']:.3f} us with barriers, "
              f"{row['tagged_us_a_round']:.3f} tagged; same bits {row['same_bits']}, "
              f"tags {tags_ok}", flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
