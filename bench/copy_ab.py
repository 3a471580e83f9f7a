"""A step's small copies by kernel (``triton_copy``) against DMA copies, at batch 1 (GPU).

The engine's batch-1 graph step as the throughput bench runs it (``PagedDecoder``'s
``recaptured_step_ms``: each step launched before the host reads the last step's
tokens), with the step's input copy, the next step's ids and the tokens' copy to the host
done by the copy kernel or by ``Tensor.copy_`` (DMA), alternated in rounds in one
process; the row-0 tokens must be the same.

Usage (GPU): ``PYTHONPATH=$PWD python bench/copy_ab.py [--model smollm2-135m]
[--rounds 4] [--out copy_ab.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics

from mmserve.bench.engine_run import prompted_decoder
from mmserve.kernels import triton_copy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    dec, first, _ = prompted_decoder(args.model)
    rows: dict[str, list[float]] = {"kernel": [], "dma": []}
    tokens: dict[str, list[list[int]]] = {"kernel": [], "dma": []}
    dec.recaptured_step_ms(first, args.steps)  # warm-up
    for r in range(args.rounds):
        for name in (("kernel", "dma") if r % 2 == 0 else ("dma", "kernel")):
            triton_copy.set_copy_kernel(name == "kernel")
            ms, row0 = dec.recaptured_step_ms(first, args.steps)
            rows[name].append(ms * 1e3)
            tokens[name].append(row0)
            print(f"round {r} {name:6s} {ms * 1e3:.1f} us a step", flush=True)
    triton_copy.set_copy_kernel(True)
    same = all(t == tokens["kernel"][0] for v in tokens.values() for t in v)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"median: kernel {med['kernel']:.1f} us, dma {med['dma']:.1f} us "
          f"({med['dma'] / med['kernel']:.4f}x); same row-0 tokens: {same}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "steps": args.steps, "us": rows, "median_us": med,
                       "same_tokens": same}, f, indent=1)


if __name__ == "__main__":
    main()
