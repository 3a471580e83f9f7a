"""When a GEMM lets the next kernel launch, and silu * up in gate_up's epilogue, in the
whole batch-1 step of a wide model (hidden above ``FUSE_MAX_HIDDEN``; CUDA only).

Under PDL a kernel lets the next one launch as soon as its programs pass the wait, so the
next kernel's programs sit on the SMs, holding shared memory and registers, while it runs
(``kernels.triton_pdl``). Session 16 (bench/NOTES.md) found that this costs where a GEMM
follows a GEMM: with silu * up skipped, down waiting beside gate_up, the 8B step went from
4,492 us with every GEMM triggering late to 4,973-5,042 us triggering early. It also found
late triggers everywhere 3-4 % slower than the default, and silu * up in gate_up's
epilogue with early triggers 2.3 % slower. Variants, each against the default
in alternated pairs, every one with the default's bits (the row-0 tokens must not move):

- ``gated``: steps of <= 16 rows take ``triton_fused.gate_up_silu`` (silu * up in the
  epilogue, no ``silu_mul`` launch), early trigger;
- ``gated_late``: the same with gate_up letting the next kernel launch after its tile's
  store (down waits then);
- ``gate_up_late``: the plain gate_up GEMM triggering late, ``silu_mul`` kept;
- ``residual_late``: the o and down GEMMs (residual epilogues) triggering late;
- ``rope_attention``: rope, the cache write and attention in one launch
  (``kernels.triton_rope_attention``; the same bits);
- ``qkv_rope_off``: the QKV product, then ``rope_write_kv`` (the default ropes and writes
  the cache in the product's epilogue, ``fused.qkv_rope``; the same bits);
- the session-18 variants that asked L2 for a GEMM's first weight columns before its PDL
  wait (0.978-1.003, bench/NOTES.md) are in git history up to commit b1ccbac.

Usage (GPU): PYTHONPATH=$PWD python bench/pdl_trigger_ab.py OUT.json [shape] [--pairs N]
[--only a,b]
"""

from __future__ import annotations

import json
import statistics
import sys

from mmserve.bench.engine_run import batch1_step_baseline
from mmserve.kernels import fused, triton_fused
from mmserve.kernels.norm import rms_norm
from mmserve.kernels.triton_matmul import invariant_linear
from mmserve.models import layers

THIN = 16
_default_mlp = fused.norm_gate_up_silu
_default_residual = fused.linear_residual


def _mlp(gated: bool, late: bool):
    def norm_gate_up_silu(x, norm_weight, eps, offset, gate_up):
        if x.numel() > THIN * x.shape[-1]:
            return _default_mlp(x, norm_weight, eps, offset, gate_up)
        h = rms_norm(x, norm_weight, eps, offset)
        if gated:
            return triton_fused.gate_up_silu(h, gate_up, late=late)
        return fused.silu_mul(invariant_linear(h, gate_up, late=late))
    return norm_gate_up_silu


def _residual_late(x, weight, residual):
    return triton_fused.linear_residual(x, weight, residual, late=True)


VARIANTS = {
    "gated": {"norm_gate_up_silu": _mlp(True, False)},
    "gated_late": {"norm_gate_up_silu": _mlp(True, True)},
    "gate_up_late": {"norm_gate_up_silu": _mlp(False, True)},
    "residual_late": {"linear_residual": _residual_late},
    "rope_attention": {"rope_attention": True},
    "qkv_rope_off": {"qkv_rope": False},
}
DEFAULT = {"norm_gate_up_silu": _default_mlp, "linear_residual": _default_residual}


def use(patches: dict) -> None:
    fused.set_rope_attention(bool(patches.get("rope_attention")))
    fused.set_qkv_rope(patches.get("qkv_rope", True))
    for name, fn in {**DEFAULT, **patches}.items():
        if name not in ("rope_attention", "qkv_rope"):
            setattr(layers, name, fn)  # the layers call these names


def main() -> None:
    out_path = sys.argv[1]
    args = [a for i, a in enumerate(sys.argv[2:], 2)
            if not a.startswith("--") and not sys.argv[i - 1].startswith("--")]
    pairs = int(sys.argv[sys.argv.index("--pairs") + 1]) if "--pairs" in sys.argv else 3
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    name = args[0] if args else "llama3-8b"
    use({})
    dec, first, report = batch1_step_baseline(name)
    assert report["hidden"] > fused.FUSE_MAX_HIDDEN, "the variants are the unfused-norm path"
    ref_row0 = report["default_row0"]
    report["variants"] = {}
    for label, patches in VARIANTS.items():
        if only and label not in only:
            continue
        ratios, same, ms = [], True, []
        for _ in range(pairs):
            use(patches)
            v_ms, v_row0 = dec.recaptured_step_ms(first)
            use({})
            b_ms, b_row0 = dec.recaptured_step_ms(first)
            same &= v_row0 == ref_row0 and b_row0 == ref_row0
            ratios.append(b_ms / v_ms)
            ms.append((b_ms, v_ms))
        report["variants"][label] = {"speedup_pairs": ratios, "default_and_variant_ms": ms,
                                     "speedup_median": statistics.median(ratios),
                                     "same_tokens": same}
        print(f"  {label:<14} x{statistics.median(ratios):.4f} "
              f"{[round(r, 4) for r in ratios]}  same={same}", flush=True)
    use({})
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
