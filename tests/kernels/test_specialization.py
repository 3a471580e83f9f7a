"""Row counts are not specialised, so the start-up warm-up reaches every kernel variant.

Triton compiles a variant of a kernel for each divisibility class of its integer
arguments (a multiple of 16, or not). A step's row count ``M`` takes both classes as
prompts and batches come and go, and each tile config a row count selects would compile
its second variant at the first step that reached it, after start-up: on an H100 this was
a 2.3-2.6 s wait for first audio at 32 speech streams with a fresh Triton cache
(docs/performance.md, Speech). Every kernel taking ``M`` leaves it unspecialised.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

triton = pytest.importorskip("triton")

import mmserve.kernels  # noqa: E402


def _jit_kernels():
    from triton.runtime.jit import JITFunction

    for info in pkgutil.iter_modules(mmserve.kernels.__path__):
        module = importlib.import_module(f"mmserve.kernels.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, JITFunction) and name.endswith("_kernel"):
                yield f"{info.name}.{name}", obj


def test_no_kernel_specialises_its_row_count():
    seen = {}
    for label, fn in _jit_kernels():
        for param in fn.params:
            if param.name == "M":
                seen[label] = param.do_not_specialize
    # the GEMMs of every prefill and mixed step, and the decode stack
    for label in (
        "triton_matmul._gemm_kernel",
        "triton_matmul._gemm_q8_kernel",
        "triton_fused._fused_gemm_kernel",
        "triton_fused._qkv_rope_kernel",
        "triton_decode_stack._decode_stack_kernel",
    ):
        assert label in seen, label
    assert all(seen.values()), sorted(k for k, v in seen.items() if not v)
