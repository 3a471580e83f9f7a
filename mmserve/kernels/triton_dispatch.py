"""When the kernel modules hand a call to Triton: CUDA tensors, triton importable, not disabled.

The plain-torch references in ``attention``, ``norm`` and ``linear`` stay the CPU path
(and the tests' reference); on CUDA they dispatch here. ``set_triton_enabled(False)``
(or ``MMSERVE_TRITON=0``) sends CUDA calls back to the references, for comparisons.
"""

from __future__ import annotations

import importlib.util
import os

import torch

_state = {"enabled": os.environ.get("MMSERVE_TRITON", "1") != "0", "found": None}


def set_triton_enabled(enabled: bool) -> None:
    _state["enabled"] = enabled


def use_triton(t: torch.Tensor) -> bool:
    """True when ``t`` lives on CUDA and the Triton kernels may run there."""
    if not t.is_cuda or not _state["enabled"]:
        return False
    if _state["found"] is None:
        _state["found"] = importlib.util.find_spec("triton") is not None
    return bool(_state["found"])
