"""Batch-1 decode of a random-weight model: the one-launch decode stack against the layered
path, alternated in one process (the device's clock drifts between runs; bench/NOTES.md).

Usage (GPU): ``PYTHONPATH=$PWD python bench/decode_stack_ab.py --out $OUT/stack_ab.json``
Each round captures the batch-1 graph anew with the setting, then times 128 greedy steps
(host argmax included, as ``bench/throughput.py``) and 200 bare graph replays. The stack's
phases, program by program: ``bench/stack_profile.py``.
"""

from __future__ import annotations

import argparse
import json

import torch

from mmserve.bench.engine_run import prompted_decoder
from mmserve.bench.limits import cuda_time_ms
from mmserve.kernels import triton_decode_stack
from mmserve.kernels.decode_stack import decode_stack_enabled, set_decode_stack_enabled
from mmserve.kernels.triton_attention import KV_AHEAD


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="stack_ab.json")
    args = ap.parse_args()
    dec, first, _ = prompted_decoder(args.model, 512)
    base = dict(triton_decode_stack.TUNING)
    # (session 8: K steps of 512 and 1024 were slower, 986-1,038 and 7,855 us; session 9:
    # the stack's L2 prefetch off, 851-852 us against 812-813)
    # name -> (the stack's TUNING, or None for the layered path; keys/values a step ahead)
    # (the stack's own attention keeps mode 1: TUNING["att_prefetch"], 813 against 825 us)
    settings = {"layered": (None, True), "layered_kv_ahead_off": (None, False),
                "stack": (base, True), "stack_kv_ahead": ({**base, "att_prefetch": 2}, True)}
    rows, default = [], decode_stack_enabled()
    for rnd in range(args.rounds):
        for name, (tuning, ahead) in settings.items():
            set_decode_stack_enabled(tuning is not None)
            KV_AHEAD["on"] = ahead
            if tuning:
                triton_decode_stack.TUNING.update(tuning)
            try:
                dec.capture((1,))
            except Exception as e:  # a launch setting the device cannot hold
                print(rnd, name, "failed:", repr(e)[:200], flush=True)
                continue
            r = dec.decode(first, 128, 128, graphs=True)
            graph = next(iter(dec.graphs.graphs.values()))
            replay_us = cuda_time_ms(lambda g=graph: [g.replay() for _ in range(200)]) * 5
            rows.append({"round": rnd, "variant": name, "tok_s": r.tok_s,
                         "replay_us": replay_us, "row0": r.row0})
            print(rnd, name, f"{r.tok_s:,.0f} tok/s", f"replay {replay_us:.1f} us", flush=True)
    set_decode_stack_enabled(default)
    triton_decode_stack.TUNING.update(base)
    KV_AHEAD["on"] = True
    same = all(r["row0"] == rows[0]["row0"] for r in rows)
    print("row 0 tokens equal across variants:", same)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "model": args.model,
                   "rows": rows, "row0_equal": same}, f, indent=1)


if __name__ == "__main__":
    main()
