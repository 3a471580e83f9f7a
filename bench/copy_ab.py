"""A step-level switch on and off, at batch 1 (GPU): the step's small copies by kernel
(``triton_copy``) or by DMA (``--switch copy``), the argmax's first pass in the lm_head's
epilogue or its own launch (``--switch argmax``).

The engine's batch-1 graph step as the throughput bench runs it (``PagedDecoder``'s
``recaptured_step_ms``: graphs captured anew, each step launched before the host reads the
last step's tokens), the switch on and off alternated in rounds in one process; the row-0
tokens must be the same.

Usage (GPU): ``PYTHONPATH=$PWD python bench/copy_ab.py [--switch copy|argmax]
[--model smollm2-135m] [--rounds 4] [--out copy_ab.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics

from mmserve.bench.engine_run import prompted_decoder
from mmserve.kernels import linear, triton_copy

SWITCHES = {"copy": triton_copy.set_copy_kernel, "argmax": linear.set_fused_argmax}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--switch", choices=sorted(SWITCHES), default="copy")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    dec, first, _ = prompted_decoder(args.model)
    switch = SWITCHES[args.switch]
    rows: dict[str, list[float]] = {"on": [], "off": []}
    tokens: dict[str, list[list[int]]] = {"on": [], "off": []}
    dec.recaptured_step_ms(first, args.steps)  # warm-up
    for r in range(args.rounds):
        for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
            switch(name == "on")
            ms, row0 = dec.recaptured_step_ms(first, args.steps)
            rows[name].append(ms * 1e3)
            tokens[name].append(row0)
            print(f"round {r} {name:6s} {ms * 1e3:.1f} us a step", flush=True)
    switch(True)
    same = all(t == tokens["on"][0] for v in tokens.values() for t in v)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{args.switch} median: on {med['on']:.1f} us, off {med['off']:.1f} us "
          f"({med['off'] / med['on']:.4f}x); same row-0 tokens: {same}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "switch": args.switch, "steps": args.steps,
                       "us": rows, "median_us": med, "same_tokens": same}, f, indent=1)


if __name__ == "__main__":
    main()
