"""Every product that promises the invariant GEMM's bits groups k as that GEMM does.

The H200 sums a dot as a chain of ``mma`` k16 instructions; two kernels give the same bits
only if each instruction gets the same k. Triton picks which k a thread holds (the
operand's kWidth) from the narrowest load it can trace the operand back to, so a kernel
can change its grouping without a line of its arithmetic changing: a Q8 head whose k
grouping comes from its int8 load (kWidth 4) is an ulp off the bf16 GEMM on the GPU. The CPU
interpreter cannot see this (its dot is one float32 product); the sm_90 TTGIR can. Every
form ``benchmarks/compile_check.py`` compiles (the decode stack's forms, the layered GEMMs,
attention, QKV + rope, the Q8 head) against the invariant GEMM
(``triton_matmul._gemm_kernel``): the same MMA, instruction shape and kWidths. The fp8 KV
cache's attention is lossy against bf16 (checked by error bounds), so its kernels are held
only to one layout among themselves.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from triton_kit import COMPILES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not COMPILES, reason="needs triton (not its interpreter)"),
]


def _compile_check():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "compile_check.py"
    spec = importlib.util.spec_from_file_location("compile_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_invariant_product_sends_the_same_k_to_each_mma():
    cc = _compile_check()
    from mmserve.kernels import triton_matmul

    # the invariant GEMM's 16-row tile: mma.sync m16n8k16, both operands in registers
    (ref,) = set(
        cc.dot_layouts(
            triton_matmul._gemm_kernel,
            {**cc.GEMM, "UPCAST": False, "LATE": False},
            num_warps=2,
            num_stages=4,
        )
    )
    assert ref[:2] == ("2", "16, 8") and len(ref) == 4, ref
    k_width = ref[2]
    checked, fp8_dots = 0, set()
    for label, fn, constexprs, fp8, options in cc.forms():
        if fp8:  # lossy against bf16 by design; its kernels must still agree with each other
            fp8_dots |= set(cc.dot_layouts(fn, constexprs, fp8, **options))
            continue
        for version, shape, *widths in cc.dot_layouts(fn, constexprs, fp8, **options):
            # mma.sync as the reference, or wgmma (64+ rows) with k16 steps, which adds
            # them alike on the H200 (docs/performance.md)
            assert (version, shape) == ref[:2] or (version == "3" and shape.endswith(", 16")), (
                label,
                version,
                shape,
            )
            assert widths == [k_width] * len(widths), (label, widths)
            assert version == "3" or len(widths) == 2, (label, widths)  # mma.sync: registers
            checked += 1
    assert checked >= 130, checked  # every form's products (the input kernel has none)
    # the fp8 cache's attention, serial and spread: one layout (kWidth 4 from its fp8 loads),
    # so a row's output does not depend on which of them ran it
    assert len(fp8_dots) == 1, fp8_dots
