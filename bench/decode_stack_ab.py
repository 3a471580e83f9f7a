"""Batch-1 decode of a random-weight model: the one-launch decode stack against the layered
path, alternated in one process (the device's clock drifts between runs; bench/NOTES.md).

Usage (GPU): ``PYTHONPATH=$PWD python bench/decode_stack_ab.py --out $OUT/stack_ab.json``
Each round captures the batch-1 graph anew with the setting, then times 128 greedy steps
(host argmax included, as ``bench/throughput.py``) and 200 bare graph replays.
"""

from __future__ import annotations

import argparse
import json

import torch

from mmserve.bench.engine_run import PagedDecoder, random_cuda_model
from mmserve.bench.limits import cuda_time_ms
from mmserve.kernels import triton_decode_stack
from mmserve.kernels.decode_stack import set_decode_stack_enabled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="stack_ab.json")
    args = ap.parse_args()
    model, cfg = random_cuda_model(args.model)
    dec = PagedDecoder(model, 1, 512)
    prompt = torch.randint(0, cfg["vocab_size"], (128,), generator=torch.Generator().manual_seed(0))
    first = dec.prefill([prompt.tolist()])
    settings = {"layered": None, "stack": {"unroll": 8, "num_stages": 3},
                "stack_u16_s2": {"unroll": 16, "num_stages": 2}}
    rows = []
    for rnd in range(args.rounds):
        for name, tuning in settings.items():
            set_decode_stack_enabled(tuning is not None)
            if tuning:
                triton_decode_stack.TUNING.update(tuning)
            dec.capture((1,))
            r = dec.decode(first, 128, 128, graphs=True)
            graph = next(iter(dec.graphs.graphs.values()))
            replay_us = cuda_time_ms(lambda g=graph: [g.replay() for _ in range(200)]) * 5
            rows.append({"round": rnd, "variant": name, "tok_s": r.tok_s,
                         "replay_us": replay_us, "row0": r.row0})
            print(rnd, name, f"{r.tok_s:,.0f} tok/s", f"replay {replay_us:.1f} us", flush=True)
    set_decode_stack_enabled(False)
    same = all(r["row0"] == rows[0]["row0"] for r in rows)
    print("row 0 tokens equal across variants:", same)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "model": args.model,
                   "rows": rows, "row0_equal": same}, f, indent=1)


if __name__ == "__main__":
    main()
