"""The grid barrier's wait, polled in several ways (``triton_grid.poll_asm``), on the GPU.

Each variant runs one launch of P programs through R barriers; between barriers each
program writes a word and, after the barrier, reads two other programs' words of that
round through L2 (a stale read counts as wrong: it must stay 0, and the counter must end
at R * P). The variants run alternated, ``--rounds`` times each; the median is reported.

Usage (GPU): ``PYTHONPATH=$PWD python bench/barrier_poll.py --out $OUT/barrier_poll.json``
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from mmserve.bench.limits import graph_replay_seconds
from mmserve.kernels.triton_grid import grid_sync, poll_asm


@triton.jit
def _barrier_loop(counter_ptr, buf_ptr, err_ptr, R, P: tl.constexpr, POLL: tl.constexpr):
    pid = tl.program_id(0)
    a = (pid + 1) % P
    b = (pid + P // 2) % P
    errors = 0
    for r in range(R):
        half = (r % 2) * P
        tl.store(buf_ptr + half + pid, r * 1000 + pid)
        grid_sync(counter_ptr, r + 1, P, POLL)
        sa = tl.load(buf_ptr + half + a, cache_modifier=".cg")
        sb = tl.load(buf_ptr + half + b, cache_modifier=".cg")
        errors += tl.where(sa == r * 1000 + a, 0, 1) + tl.where(sb == r * 1000 + b, 0, 1)
    tl.store(err_ptr + pid, errors)


VARIANTS = {"triton": "", "r1": poll_asm(1, 0, False), "a1": poll_asm(1, 0, True),
            "r1_g50": poll_asm(1, 0, False, 50), "r1_g150": poll_asm(1, 0, False, 150),
            "r1_g400": poll_asm(1, 0, False, 400), "a1_g150": poll_asm(1, 0, True, 150),
            "r2_200": poll_asm(2, 200, False), "r4_100": poll_asm(4, 100, False),
            "r4_200": poll_asm(4, 200, False), "a4_100": poll_asm(4, 100, True),
            "r8_60": poll_asm(8, 60, False)}


def barrier_us(programs: int, rounds: int, poll: str) -> dict:
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    buf = torch.zeros(2 * programs, dtype=torch.int32, device="cuda")
    err = torch.zeros(programs, dtype=torch.int32, device="cuda")

    def run() -> None:
        counter.zero_()
        _barrier_loop[(programs,)](counter, buf, err, rounds, P=programs, POLL=poll,
                                   num_warps=4)

    sec = graph_replay_seconds(run, reps=20)
    return {"us": sec / rounds * 1e6, "wrong": int(err.sum()),
            "counter_ok": int(counter) == rounds * programs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--barriers", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--programs", type=int, nargs="+", default=[96, 132])
    ap.add_argument("--out", default="barrier_poll.json")
    args = ap.parse_args()
    out: dict = {"device": torch.cuda.get_device_name(0), "rows": []}
    for p in args.programs:
        runs: dict = {k: [] for k in VARIANTS}
        for r in range(args.rounds):
            names = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
            for k in names:
                runs[k].append(barrier_us(p, args.barriers, VARIANTS[k]))
        for k, rs in runs.items():
            row = {"programs": p, "variant": k,
                   "us": statistics.median(x["us"] for x in rs),
                   "all_us": [round(x["us"], 4) for x in rs],
                   "wrong": sum(x["wrong"] for x in rs),
                   "counter_ok": all(x["counter_ok"] for x in rs)}
            out["rows"].append(row)
            print(row, flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
