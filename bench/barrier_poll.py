"""The grid barrier's wait, polled in several ways (``triton_grid.poll_asm``), on the GPU.

Each variant runs one launch of P programs through R barriers; between barriers each
program writes a word and, after the barrier, reads two other programs' words of that
round through L2 (a stale read counts as wrong: it must stay 0, and the counter must end
at R * P). The variants run alternated, ``--rounds`` times each; the median is reported.

``FLAGS``' variants wait on release words instead of the counter (``grid_sync_flags``).

Usage (GPU): ``PYTHONPATH=$PWD python bench/barrier_poll.py --out $OUT/barrier_poll.json
[--only r1 last_own ...]``
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from mmserve.bench.limits import graph_replay_seconds
from mmserve.kernels.triton_grid import (
    grid_sync,
    grid_sync_flags,
    last_release_asm,
    poll_asm,
)


@triton.jit
def _barrier_loop(counter_ptr, flags_ptr, buf_ptr, err_ptr, R, P: tl.constexpr,
                  POLL: tl.constexpr, MODE: tl.constexpr, LINES: tl.constexpr,
                  NP: tl.constexpr):
    pid = tl.program_id(0)
    a = (pid + 1) % P
    b = (pid + P // 2) % P
    errors = 0
    for r in range(R):
        half = (r % 2) * P
        tl.store(buf_ptr + half + pid, r * 1000 + pid)
        if MODE == 0:
            grid_sync(counter_ptr, r + 1, P, POLL)
        else:
            grid_sync_flags(counter_ptr, flags_ptr, r + 1, P, pid, POLL, MODE, LINES, NP)
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
# The release words (``triton_grid.grid_sync_flags``): NAME -> (MODE, lines (0: one a
# program), release stores (MODE 1's), loads in flight of the lead's waits). "last": the
# last arrival (a returning atomic) writes them (``last_release_asm``); "lead": program 0
# polls the counter and writes them.
FLAGS = {"last_own": (1, 0, False, 1), "last_own_rel": (1, 0, True, 1),
         "last_8": (1, 8, False, 1), "last_1": (1, 1, False, 1),
         "lead_own": (2, 0, False, 1), "lead_own_r2": (2, 0, False, 2),
         "lead_8": (2, 8, False, 1)}


def barrier_us(programs: int, rounds: int, poll: str, mode: int = 0, lines: int = 0,
               rel: bool = False) -> dict:
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    lines = lines or programs
    if mode == 1:
        poll = last_release_asm(lines, rel)
    flags = torch.zeros(lines * 32, dtype=torch.int32, device="cuda")
    buf = torch.zeros(2 * programs, dtype=torch.int32, device="cuda")
    err = torch.zeros(programs, dtype=torch.int32, device="cuda")

    def run() -> None:
        counter.zero_()
        flags.zero_()
        _barrier_loop[(programs,)](counter, flags, buf, err, rounds, P=programs, POLL=poll,
                                   MODE=mode, LINES=lines,
                                   NP=max(triton.next_power_of_2(lines), 128),
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
    ap.add_argument("--only", nargs="*", default=None, help="these variants alone")
    args = ap.parse_args()
    out: dict = {"device": torch.cuda.get_device_name(0), "rows": []}
    table = {**{k: (v, 0, 0, False) for k, v in VARIANTS.items()},
             **{k: (poll_asm(n, 100, False), m, lines, rel)
                for k, (m, lines, rel, n) in FLAGS.items()}}
    table = {k: v for k, v in table.items() if args.only is None or k in args.only}
    for p in args.programs:
        runs: dict = {k: [] for k in table}
        for r in range(args.rounds):
            names = list(table) if r % 2 == 0 else list(reversed(table))
            for k in names:
                runs[k].append(barrier_us(p, args.barriers, *table[k]))
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
