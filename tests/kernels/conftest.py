"""Kernel tests: a work-around for Triton's interpreter (CPU runs with TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
from triton_kit import INTERPRET, ON_CUDA


@pytest.fixture(autouse=True)
def _interpreter_numpy2_index(monkeypatch):
    """Triton 3.6's interpreter turns a scalar kernel argument into a 1-element array and
    ``range(0, K, BK)`` calls ``int()`` on it, which numpy >= 2.4 refuses for ndim > 0
    (test_triton_matmul fails the same way here). Read the element instead."""
    if not INTERPRET or ON_CUDA:
        return
    from triton.runtime import interpreter

    real = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        real(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched)
