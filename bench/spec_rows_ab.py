"""The GPU spec bench with the one-launch stack taking steps of up to ``--max-rows`` tokens.

``--max-rows 16`` (the default engine) runs verify steps of <= 16 rows through the stack;
``--max-rows 1`` is the one-token stack of session 9 (verify steps on the layered kernels).
Each run is ``mmserve bench spec``'s protocol (plain and speculative in interleaved pairs
on one engine, all outputs compared).

Usage (GPU): ``PYTHONPATH=$PWD python bench/spec_rows_ab.py MODEL.gguf OUT_DIR --max-rows 16``
(writes OUT_DIR/NAME/spec.json and spec.png).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmserve.bench.spec import run_spec_bench
from mmserve.kernels.decode_stack import set_decode_stack_rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out_dir")
    ap.add_argument("--max-rows", type=int, default=16)
    ap.add_argument("--name", default="spec")
    ap.add_argument("--repeats", type=int, default=11)
    args = ap.parse_args()
    set_decode_stack_rows(args.max_rows)
    out = Path(args.out_dir) / args.name
    report = run_spec_bench(args.model, device="cuda", max_tokens=128, repeats=args.repeats,
                            out_dir=out)
    report["decode_stack_max_rows"] = args.max_rows
    (out / "spec.json").write_text(json.dumps(report, indent=2))
    for r in report["rows"]:
        print(f"{r['workload']:>5} c={r['concurrency']:<2} {r['speedup']:.3f}x "
              f"plain {r['plain_tok_s']:8.0f} spec {r['spec_tok_s']:8.0f} "
              f"drafted {r['drafted']:5d} acc {r['acceptance']:.2f} "
              f"{'same' if r['identical'] else 'DIFFER'}", flush=True)


if __name__ == "__main__":
    main()
