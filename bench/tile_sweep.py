"""Thin-tile shapes (steps of <= 16 rows) per GEMM width, measured in the whole batch-1 step.

``pick_config`` gives every GEMM of up to 16 rows one of two thin tiles (by width), chosen by
sweeps of each GEMM alone (bench/NOTES.md). Alone is not the step: in the PDL chain a GEMM's
ramp and tail overlap its neighbours'. Here each candidate tile for one width (the others
at the default) runs the captured batch-1 decode graph of the model shape, alternated
with the default in pairs (the machine drifts), and the row-0 tokens must not move (the
tile shape never changes an element's arithmetic).

The residual GEMMs (o and down at the 8B shape) share a width, so they are also swept by
their K (``RESIDUAL``, through ``triton_fused.linear_residual``'s tile argument): a thin
program is bound by the weight bytes it has in flight (stages x tile), which K does not
change but the kernel's length (ramp and tail against the stream) does.

Usage (GPU): PYTHONPATH=$PWD python bench/tile_sweep.py OUT.json [shape] [--pairs N]
[--only widths|residual|combos] [--width N (one width of CANDIDATES)]
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
    28672: [T(16, 64, 256, 4, 3), T(16, 32, 256, 4, 4), T(16, 32, 512, 4, 3),
            T(16, 16, 256, 2, 4)],
    128256: [T(16, 32, 256, 4, 4), T(16, 64, 256, 4, 3), T(16, 128, 128, 4, 4)],
    # SmolLM2-135M's lm_head (K = 576; the only thin GEMM of its batch-1 step, the layers
    # being the decode stack's): the first pick_config's (NARROW_K), 16x32x256 before (its
    # third K step of 256 ran 12 of 16 k16 products on zeros)
    49152: [T(16, 128, 64, 4, 5), T(16, 32, 256, 4, 4), T(16, 32, 64, 4, 9), T(16, 64, 64, 4, 9),
            T(16, 32, 64, 2, 9), T(16, 64, 64, 4, 5), T(16, 256, 64, 8, 5),
            T(16, 64, 128, 4, 5), T(16, 32, 128, 4, 5)],
}
# K of a residual GEMM (o: the attention width, down: the MLP's) -> candidates, the first
# what ``triton_fused.residual_config`` gives on sm_90 (4 stages before session 18, which
# measured against it: down (256, 6) 1.011, (256, 7) 1.012, (128, 12) 1.016, (256, 6) with
# 4 warps 0.963; o (256, 6) 1.015, (128, 8) 1.001)
RESIDUAL = {
    14336: [T(16, 16, 256, 2, 7), T(16, 16, 256, 2, 8)],
    4096: [T(16, 16, 256, 2, 6), T(16, 16, 256, 2, 7), T(16, 16, 256, 2, 8)],
}
# several GEMMs at once ("k": residual K -> tile, "n": width -> tile), each against the
# default: the tiles of before session 18, and its first kept version (session 18's first
# measurements against 4 stages: down (128, 12) + o (256, 6) 1.015, (256, 7) + (256, 6)
# 1.017, (128, 16) + (256, 7) 0.885, (256, 8) + (128, 10) 0.990)
COMBOS = [
    {"k": {14336: T(16, 16, 256, 2, 4), 4096: T(16, 16, 256, 2, 4)},
     "n": {28672: T(16, 32, 256, 4, 4)}},
    {"k": {14336: T(16, 16, 256, 2, 8), 4096: T(16, 16, 256, 2, 8)}, "n": {}},
    {"k": {}, "n": {28672: T(16, 32, 256, 4, 4)}},
]
# more stages for the widths whose GEMM goes through pick_config alone at 8B, in as few
# waves as before (session 18 measured qkv (256, 6) 0.977 and (256, 7) 0.985: 2 programs
# an SM, so 384 of them in two waves; gate_up (128, 8) 0.984, (128, 9) 0.998)
STAGES = {
    6144: [T(16, 16, 256, 2, 4), T(16, 16, 256, 2, 5), T(16, 32, 256, 4, 5)],
    28672: [T(16, 64, 256, 4, 3), T(16, 32, 256, 4, 4), T(16, 128, 64, 4, 5)],
}
_chosen: dict[int, TileConfig] = {}
_by_k: dict[int, TileConfig] = {}
_default = triton_matmul.pick_config
_residual = triton_fused.linear_residual


def residual_patched(x, weight, residual, config=None, late=False):
    k = x.shape[-1]
    if config is None and k in _by_k and x.numel() <= 16 * k:
        config = _by_k[k]
    return _residual(x, weight, residual, config, late)


def patched(m: int, n: int, k: int | None = None) -> TileConfig:
    if m <= 16 and n in _chosen:
        return _chosen[n]
    return _default(m, n, k)


def main() -> None:
    out_path = sys.argv[1]
    args = [a for a in sys.argv[2:] if not a.startswith("--")]
    pairs = int(sys.argv[sys.argv.index("--pairs") + 1]) if "--pairs" in sys.argv else 2
    name = args[0] if args else "llama3-8b"
    triton_matmul.pick_config = patched
    triton_fused.pick_config = patched
    triton_fused.linear_residual = residual_patched
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    dec, first, report = batch1_step_baseline(name)
    ref_row0 = report["default_row0"]

    width = int(sys.argv[sys.argv.index("--width") + 1]) if "--width" in sys.argv else None

    def sweep(table: dict, chosen: dict, label: str, key: str) -> None:
        report[key] = {}
        for size, cands in table.items():
            if width is not None and size != width:
                continue
            rows = []
            for cand in cands[1:]:
                ratios, same = [], True
                for _ in range(pairs):
                    chosen[size] = cand
                    c_ms, c_row0 = dec.recaptured_step_ms(first)
                    chosen.pop(size)
                    b_ms, b_row0 = dec.recaptured_step_ms(first)
                    same &= c_row0 == ref_row0 and b_row0 == ref_row0
                    ratios.append(b_ms / c_ms)
                rows.append({"tile": list(cand), "speedup_pairs": ratios,
                             "speedup_median": statistics.median(ratios), "same_tokens": same})
                print(f"  {label}={size:<6} {tuple(cand)}  x{statistics.median(ratios):.4f} "
                      f"{[round(r, 4) for r in ratios]}  same={same}", flush=True)
            report[key][str(size)] = {"default": list(cands[0]), "candidates": rows}

    if only == "combos":
        report["combos"] = []
        for combo in COMBOS:
            ratios, same = [], True
            for _ in range(pairs):
                _by_k.update(combo["k"])
                _chosen.update(combo["n"])
                c_ms, c_row0 = dec.recaptured_step_ms(first)
                _by_k.clear()
                _chosen.clear()
                b_ms, b_row0 = dec.recaptured_step_ms(first)
                same &= c_row0 == ref_row0 and b_row0 == ref_row0
                ratios.append(b_ms / c_ms)
            report["combos"].append({"tiles": {f"{kind} {size}": list(t)
                                               for kind in ("k", "n")
                                               for size, t in combo[kind].items()},
                                     "speedup_pairs": ratios, "same_tokens": same,
                                     "speedup_median": statistics.median(ratios)})
            print(f"  combo {report['combos'][-1]['tiles']}  "
                  f"x{statistics.median(ratios):.4f} {[round(r, 4) for r in ratios]}  "
                  f"same={same}", flush=True)
    if only in (None, "residual"):
        sweep(RESIDUAL, _by_k, "residual k", "residual")
        sweep(STAGES, _chosen, "stages n", "stages")
    if only in (None, "widths"):
        sweep(CANDIDATES, _chosen, "n", "widths")
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
