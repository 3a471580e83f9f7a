"""What handing a row from one phase to the next costs: a grid barrier, or tags in the data.

The decode stack (mmserve/kernels/triton_decode_stack.py) separates its phases with grid
barriers: a producer's stores, a release (its writes reach L2), an atomic arrival, a poll
that sees the last arrival, then the consumer's own load of the row it needs: about three
and a half dependent L2 trips between the last store of a phase and the first use of its
output. With a tag carried in each 32-bit word (the value in the high half, the round's
tag in the low half), the consumer's load of the row is the wait: it reloads until every
word carries this round's tag. No fence and no counter; a word is written once a round and
a 32-bit store is seen whole, so a word with the right tag holds the right value.

Both ways (one kernel, ``TAGGED`` or not) run R rounds on P programs: the first NPROD
programs each store a tile of 16 words of the round's row (its own buffer a round, as the
stack's buffers are a layer's),
then every program reads the whole row and sums its values; the sum goes into the next
round's stores, so the rounds are a chain and a stale read changes every later value. The
two ways compute the same recurrence, so their last rows must be equal (checked).

Usage (GPU): ``PYTHONPATH=$PWD python bench/handoff.py --out $OUT/handoff.json``
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from mmserve.bench.limits import cuda_time_ms
from mmserve.kernels.triton_grid import grid_sync

TILE = tl.constexpr(16)  # words a producer stores a round (the stack's GEMM tiles: 16 wide)


@triton.jit
def _row_sum(w, ok):
    """The values (high halves) of a row's words, summed (integers: any order)."""
    return tl.sum(tl.where(ok, (w >> 16) & 0xFFFF, 0), 0)


@triton.jit(do_not_specialize=["R", "base"])
def _rounds(buf_ptr, counter_ptr, R, base, NPROD: tl.constexpr, P: tl.constexpr,
            ROWP2: tl.constexpr, TAGGED: tl.constexpr):
    """R rounds: the producers' tiles stored, then the row read after a grid barrier
    (TAGGED False) or reloaded until every word carries the round's tag (True)."""
    pid = tl.program_id(0)
    ROW: tl.constexpr = NPROD * TILE
    idx = tl.arange(0, ROWP2)
    ok = idx < ROW
    cols = pid * TILE + tl.arange(0, TILE)
    val = pid * 0
    for r in range(R):
        row = buf_ptr + r.to(tl.int64) * ROW
        tag = (base + r) & 0xFFFF
        if pid < NPROD:
            tl.store(row + cols, (((val + cols) & 0xFFFF) << 16) | tag)
        if TAGGED:
            w = tl.load(row + idx, mask=ok, other=0, volatile=True)
            stale = tl.sum(tl.where(ok & ((w & 0xFFFF) != tag), 1, 0), 0)
            while stale > 0:
                w = tl.load(row + idx, mask=ok, other=0, volatile=True)
                stale = tl.sum(tl.where(ok & ((w & 0xFFFF) != tag), 1, 0), 0)
        else:
            grid_sync(counter_ptr, r + 1, P)
            w = tl.load(row + idx, mask=ok, other=0, cache_modifier=".cg")
        val = _row_sum(w, ok) & 0x7FFF


def run(kind: str, programs: int, producers: int, rounds: int, repeats: int) -> dict:
    row = producers * TILE.value
    buf = torch.zeros(rounds * row, dtype=torch.int32, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    base = [1]

    def launch() -> None:
        counter.zero_()
        _rounds[(programs,)](buf, counter, rounds, base[0], NPROD=producers, P=programs,
                             ROWP2=triton.next_power_of_2(row), TAGGED=kind == "tagged",
                             num_warps=4)
        base[0] = (base[0] + rounds) % 65536 or 1  # every word's tag changes each launch

    ms = cuda_time_ms(launch, repeats=repeats)
    last = buf[(rounds - 1) * row:].clone()
    return {"kind": kind, "programs": programs, "producers": producers, "rounds": rounds,
            "us_per_round": ms * 1e3 / rounds, "last_row": last, "tags_ok": bool(
                ((last & 0xFFFF) == (base[0] - 1) % 65536).all())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="handoff.json")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for programs, producers in ((1, 1), (36, 36), (96, 36), (96, 60), (96, 96),
                                (min(sms, 132), 96)):
        pair = [run(kind, programs, producers, args.rounds, args.repeats)
                for kind in ("barrier", "tagged", "barrier", "tagged")]
        same = all(torch.equal(p["last_row"] >> 16, pair[0]["last_row"] >> 16) for p in pair)
        for p in pair:
            p.pop("last_row")
            p["same_values"] = same
            print(p, flush=True)
            rows.append(p)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "sms": sms, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
