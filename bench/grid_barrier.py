"""What a grid-wide barrier costs on the GPU, against a chain of dependent launches.

A persistent decode kernel replaces each kernel boundary of a layer with a grid barrier
(mmserve/kernels/triton_grid.py); this measures the two on the same device:

- ``barrier``: one launch of P programs passing R barriers; between barriers each program
  writes one word and, after the barrier, reads its neighbour's (checked: the count of
  wrong reads must be 0, and the counter must end at R * P);
- ``chain``: R dependent launches of P programs each (programmatic dependent launch as
  the decode chain uses it), replayed from a CUDA graph.

Usage (GPU): ``PYTHONPATH=$PWD python bench/grid_barrier.py --out $OUT/grid_barrier.json``
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from mmserve.bench.limits import graph_replay_seconds
from mmserve.kernels.triton_grid import grid_sync
from mmserve.kernels.triton_pdl import pdl_args, wait_previous


@triton.jit
def _barrier_loop(counter_ptr, buf_ptr, err_ptr, R, P: tl.constexpr):
    pid = tl.program_id(0)
    nxt = (pid + 1) % P
    errors = 0
    for r in range(R):
        half = (r % 2) * P
        tl.store(buf_ptr + half + pid, r * 1000 + pid)
        grid_sync(counter_ptr, r + 1, P)
        seen = tl.load(buf_ptr + half + nxt, cache_modifier=".cg")
        errors += tl.where(seen == r * 1000 + nxt, 0, 1)
    tl.store(err_ptr + pid, errors)


@triton.jit
def _step(buf_ptr, PDL: tl.constexpr):
    wait_previous(PDL)
    pid = tl.program_id(0)
    tl.store(buf_ptr + pid, tl.load(buf_ptr + pid) + 1)


def barrier_us(programs: int, rounds: int) -> dict:
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    buf = torch.zeros(2 * programs, dtype=torch.int32, device="cuda")
    err = torch.zeros(programs, dtype=torch.int32, device="cuda")

    def run() -> None:
        counter.zero_()
        _barrier_loop[(programs,)](counter, buf, err, rounds, P=programs, num_warps=4)

    sec = graph_replay_seconds(run, reps=20)
    return {"programs": programs, "rounds": rounds, "us_per_barrier": sec / rounds * 1e6,
            "wrong_reads": int(err.sum()), "counter": int(counter),
            "counter_expected": rounds * programs}


def chain_us(programs: int, launches: int) -> dict:
    buf = torch.zeros(programs, dtype=torch.int32, device="cuda")

    def run() -> None:
        for _ in range(launches):
            _step[(programs,)](buf, num_warps=4, **pdl_args(buf))

    sec = graph_replay_seconds(run, reps=20)
    return {"programs": programs, "launches": launches, "us_per_launch": sec / launches * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--out", default="grid_barrier.json")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sizes = sorted({1, 16, 64, sms // 2, sms})
    out = {"device": torch.cuda.get_device_name(0), "sms": sms,
           "barrier": [barrier_us(p, args.rounds) for p in sizes],
           "chain": [chain_us(p, 500) for p in sizes]}
    for row in out["barrier"] + out["chain"]:
        print(row, flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
