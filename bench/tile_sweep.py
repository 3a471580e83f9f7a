"""Thin-tile shapes (steps of <= 16 rows) per GEMM width, measured in the whole batch-1 step.

``pick_config`` gives every GEMM of up to 16 rows one of two thin tiles (by width), chosen by
sweeps of each GEMM alone (bench/NOTES.md). Alone is not the step: in the PDL chain a GEMM's
ramp and tail overlap its neighbours'. Here each candidate tile for one width (the others
at the default) runs the captured batch-1 decode graph of the model shape, alternated
with the default in pairs (the machine drifts), and the row-0 tokens must not move (the
tile shape never changes an element's arithmetic).

Usage (GPU): PYTHONPATH=$PWD python bench/tile_sweep.py OUT.json [shape] [--pairs N]
"""

from __future__ import annotations

import json
import statistics
import sys

from mmserve.bench.engine_run import batch1_step_baseline
from mmserve.kernels import triton_fused, triton_matmul
from mmserve.kernels.triton_matmul import TileConfig

T = TileConfig
# width -> candidate thin tiles (the first: what pick_config gives at the 8B shape)
CANDIDATES = {
    4096: [T(16, 16, 256, 2, 4), T(16, 16, 512, 2, 3), T(16, 16, 256, 4, 4),
           T(16, 32, 256, 4, 4), T(16, 16, 128, 2, 8), T(16, 16, 512, 4, 4)],
    6144: [T(16, 16, 256, 2, 4), T(16, 32, 256, 4, 4), T(16, 16, 512, 2, 3)],
    28672: [T(16, 32, 256, 4, 4), T(16, 64, 256, 4, 3), T(16, 32, 512, 4, 3),
            T(16, 16, 256, 2, 4)],
    128256: [T(16, 32, 256, 4, 4), T(16, 64, 256, 4, 3), T(16, 128, 128, 4, 4)],
}
_chosen: dict[int, TileConfig] = {}
_default = triton_matmul.pick_config


def patched(m: int, n: int) -> TileConfig:
    if m <= 16 and n in _chosen:
        return _chosen[n]
    return _default(m, n)


def main() -> None:
    out_path = sys.argv[1]
    args = [a for a in sys.argv[2:] if not a.startswith("--")]
    pairs = int(sys.argv[sys.argv.index("--pairs") + 1]) if "--pairs" in sys.argv else 2
    name = args[0] if args else "llama3-8b"
    triton_matmul.pick_config = patched
    triton_fused.pick_config = patched
    dec, first, report = batch1_step_baseline(name)
    ref_row0 = report["default_row0"]
    report["widths"] = {}
    for width, cands in CANDIDATES.items():
        rows = []
        for cand in cands[1:]:
            ratios, same = [], True
            for _ in range(pairs):
                _chosen[width] = cand
                c_ms, c_row0 = dec.recaptured_step_ms(first)
                _chosen.pop(width)
                b_ms, b_row0 = dec.recaptured_step_ms(first)
                same &= c_row0 == ref_row0 and b_row0 == ref_row0
                ratios.append(b_ms / c_ms)
            rows.append({"tile": list(cand), "speedup_pairs": ratios,
                         "speedup_median": statistics.median(ratios), "same_tokens": same})
            print(f"  n={width:<6} {tuple(cand)}  x{statistics.median(ratios):.4f} "
                  f"{[round(r, 4) for r in ratios]}  same={same}", flush=True)
        report["widths"][str(width)] = {"default": list(cands[0]), "candidates": rows}
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
