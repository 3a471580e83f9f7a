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
from mmserve.kernels.decode_stack import decode_stack_enabled, set_decode_stack_enabled
from mmserve.kernels.triton_attention import KV_AHEAD

PHASES = ("qkv", "rope+attention", "o+residual", "gate_up+silu", "down+residual")


@torch.inference_mode()
def phase_times(model, dec) -> dict:
    """Program 0's clock in one stack launch (the next decode position): per phase, the
    median over layers of its own work and of its wait at the barrier after it."""
    from mmserve.kernels.attention import AttentionMetadata
    from mmserve.kernels.decode_stack import stacked_weights
    from mmserve.kernels.triton_attention import paged_metadata
    from mmserve.kernels.triton_decode_stack import decode_stack

    n_layers = model.num_layers
    table = [int(b) for b in dec.tables[0]]
    meta = paged_metadata(AttentionMetadata.build([1], [300], [table], 16, dec.device), 16)
    x = model.embed(torch.tensor([7], device=dec.device))
    pos = torch.tensor([299], device=dec.device)
    from mmserve.kernels.triton_decode_stack import default_programs

    programs = default_programs(stacked_weights(model.layers), model.num_kv_heads, dec.device)
    timing = torch.zeros(programs, 4 + 10 * n_layers, dtype=torch.int64, device=dec.device)

    def launch() -> None:
        decode_stack(x, stacked_weights(model.layers), dec.kv, model.rope.cos, model.rope.sin,
                     pos, meta.slot_mapping, meta.block_tables, meta.context_lens,
                     meta.query_start, meta.query_lens, 1, heads=model.num_heads,
                     kv_heads=model.num_kv_heads, eps=model.eps, scale=model.head_dim**-0.5,
                     timing=timing)

    launch_ms = cuda_time_ms(launch)
    t = timing[0].cpu().tolist()  # program 0's row
    cycles = t[2 * 5 * n_layers + 1] - t[1]
    us_per_cycle = launch_ms * 1e3 / cycles  # the launch also copies x in and allocates
    out = {"launch_us": launch_ms * 1e3, "us_per_cycle": us_per_cycle}
    for i, name in enumerate(PHASES):
        work = sorted(t[2 * p] - t[2 * p + 1] for p in range(i, 5 * n_layers, 5))
        wait = sorted(t[2 * p + 3] - t[2 * p] for p in range(i, 5 * n_layers, 5))
        out[name] = {"work_us": work[len(work) // 2] * us_per_cycle,
                     "barrier_us": wait[len(wait) // 2] * us_per_cycle}
        print(f"{name:16s} work {out[name]['work_us']:.2f} us  barrier "
              f"{out[name]['barrier_us']:.2f} us", flush=True)
    return out


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
    phases = {}
    for name, (tuning, ahead) in settings.items():
        if tuning:
            print(name, flush=True)
            triton_decode_stack.TUNING.update(tuning)
            KV_AHEAD["on"] = ahead
            phases[name] = phase_times(model, dec)
    triton_decode_stack.TUNING.update(base)
    KV_AHEAD["on"] = True
    same = all(r["row0"] == rows[0]["row0"] for r in rows)
    print("row 0 tokens equal across variants:", same)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "model": args.model,
                   "rows": rows, "row0_equal": same, "phases": phases}, f, indent=1)


if __name__ == "__main__":
    main()
