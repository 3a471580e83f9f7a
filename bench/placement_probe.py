"""Does where the decode stack's scratch lands move the batch-1 step? A probe.

Session 39's ``step_ab.py`` rounds on an H100 fell in two groups, ~565-570 and ~583-595 us,
for one setting (each round captures the graphs anew, so the stack's buffers come from a
new graph pool). This captures the default ``--rounds`` times and prints, per capture, the
engine's batch-1 step (``step_ab.py``'s measure: 100 greedy steps launched ahead) beside
the device addresses of the stack kernel's buffers in the graph it replays (the serial
variant's at 129-228 cached tokens), to look for what the fast captures share.

Usage (GPU): ``PYTHONPATH=$PWD python bench/placement_probe.py --out $OUT/placement.json``
"""

from __future__ import annotations

import argparse
import json

import torch

from mmserve.bench.engine_run import prompted_decoder
from mmserve.kernels import triton_decode_stack as tds

# the stack kernel's buffers whose placement could matter (hot, written and polled)
WATCH = ("xs_ptr", "mids_ptr", "qrot_ptr", "attn_ptr", "act_ptr", "counter_ptr", "ysi_ptr",
         "psi_ptr", "ysm_ptr", "psm_ptr", "part_ptr", "count_ptr", "pos_ptr", "tables_ptr")


class _Recorder:
    """Stands in for ``_decode_stack_kernel``: records each launch's tensor addresses."""

    def __init__(self, kernel) -> None:
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            names = self.kernel.arg_names
            ptrs = {names[i]: a.data_ptr() for i, a in enumerate(args)
                    if isinstance(a, torch.Tensor)}
            self.launches.append(ptrs)
            return launch(*args, **kwargs)
        return run


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--start", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2,
                    help="decodes a capture: the same graph timed again (placement or time?)")
    ap.add_argument("--out", default="placement.json")
    args = ap.parse_args()
    dec, first, _ = prompted_decoder(args.model, args.start + args.steps + 16, q8_head=True)
    rec = _Recorder(tds._decode_stack_kernel)
    tds._decode_stack_kernel = rec
    rows = []
    try:
        for rnd in range(args.rounds):
            rec.launches.clear()
            dec.capture((1,))
            ptrs = rec.launches[-1]  # the last capture: the serial graph where there is one
            us, tokens = [], []
            for _ in range(args.repeats):
                r = dec.decode(first, args.start, args.steps, graphs=True, ahead=True)
                us.append(r.seconds / r.steps * 1e6)
                tokens.append(r.row0)
            row = {"round": rnd, "step_us": us, "tokens": tokens[0],
                   "same_in_round": all(t == tokens[0] for t in tokens), "ptrs": ptrs,
                   "launches": len(rec.launches)}
            rows.append(row)
            shown = " ".join(f"{k[:-4]}={ptrs[k] & 0xFFFFFF:06x}" for k in WATCH if k in ptrs)
            print(f"{rnd:2d} {' '.join(f'{u:6.1f}' for u in us)} us  {shown}", flush=True)
    finally:
        tds._decode_stack_kernel = rec.kernel
    same = all(r["tokens"] == rows[0]["tokens"] and r["same_in_round"] for r in rows)
    print(f"same tokens every round: {same}")
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "start": args.start, "steps": args.steps,
                   "rows": rows, "same_tokens": same}, f, indent=1)


if __name__ == "__main__":
    main()
