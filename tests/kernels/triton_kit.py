"""Where the Triton kernel tests run: on CUDA, or on CPU under Triton's interpreter.

``TRITON_INTERPRET=1`` (with triton installed) runs the kernels on CPU tensors in
numpy, slowly and in float32: a way to check a kernel's logic without a GPU. With
neither, the tests skip.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton")
ON_CUDA = torch.cuda.is_available() and importlib.util.find_spec("triton") is not None
# jit functions compiled (for sm_90 on any machine), not interpreted
COMPILES = (
    importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") != "1"
)

needs_triton = pytest.mark.skipif(
    not (ON_CUDA or INTERPRET), reason="needs CUDA + triton (or TRITON_INTERPRET=1)"
)
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
DTYPE = torch.bfloat16 if ON_CUDA else torch.float32
TOL = 2e-2 if ON_CUDA else 1e-4
