"""When the kernel modules hand a call to Triton: CUDA tensors, triton importable, not disabled.

The plain-torch references in ``attention``, ``norm`` and ``linear`` stay the CPU path
(and the tests' reference); on CUDA they dispatch here. ``KernelConfig.triton`` off
(``MMSERVE_TRITON=0``) sends CUDA calls back to the references, for comparisons.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from mmserve.kernels.settings import current


@functools.cache
def _found() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(t: torch.Tensor) -> bool:
    """True when ``t`` lives on CUDA and the Triton kernels may run there."""
    return t.is_cuda and current().triton and _found()
