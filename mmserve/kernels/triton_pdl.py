"""Programmatic dependent launch (PDL) for the decode chain's Triton kernels (sm_90+).

A batch-1 decode step is a chain of short kernels, each waiting for the one before it,
and the gaps between them are a large part of the step. With PDL a kernel is launched
while its predecessor still runs and waits at ``griddepcontrol.wait`` for the
predecessor to finish and its writes to be visible: the launch and the program start-up
overlap the predecessor's tail: a large gain for a launch-bound small model, noise at
the Llama-3-8B shape. Work before the wait (prefetching weights into L2, loading a thin
GEMM tile's first weight block) was measured and not kept (docs/performance.md).

Rules every kernel launched with ``launch_pdl`` here keeps:

- it reads nothing before ``wait_previous``, where the predecessor may still be writing;
- every program runs ``wait_previous`` before it writes or exits, so a grid cannot
  finish before its predecessor has (a chain of waits is then a chain of completions);
- ``wait_previous`` also lets the next kernel launch: at most two kernels of the chain
  are resident, the one computing and the next one, waiting.
- A GEMM launched with ``late`` waits with ``wait_only`` instead and lets the next kernel
  launch with ``launch_next`` after its K loop (the fused GEMMs: after the tile's store),
  so the waiting programs do not hold shared memory and registers while it streams. Off
  by default: late for every GEMM exposes the small kernels' launches again and the
  step is slower (docs/performance.md).

Only the launch and the order of memory traffic change: every kernel computes the same
bits with PDL on or off (tests on the GPU compare them). Off on CPU, in the Triton
interpreter, below sm_90, or with ``KernelConfig.pdl`` off (``MMSERVE_PDL=0``).
"""

from __future__ import annotations

import os

import torch

from mmserve.kernels.settings import current

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

_SM90: dict[int, bool] = {}  # device index -> whether it is sm_90 or newer


def pdl_launch(t: torch.Tensor) -> bool:
    """Whether kernels working on ``t`` launch with PDL (CUDA, sm_90+, compiled Triton)."""
    if not (t.is_cuda and current().pdl) or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    ok = _SM90.get(dev)
    if ok is None:
        ok = _SM90[dev] = torch.cuda.get_device_capability(dev)[0] >= 9
    return ok


def pdl_args(t: torch.Tensor) -> dict[str, bool]:
    """Launch keywords for a kernel with a ``PDL`` constexpr that calls ``wait_previous``:
    the constexpr and the launch attribute always agree (a kernel launched early that
    did not wait would read its predecessor's unfinished output)."""
    on = pdl_launch(t)
    return {"PDL": on, "launch_pdl": on}


def gemm_pdl_args(t: torch.Tensor, late: bool) -> dict[str, bool]:
    """``pdl_args`` plus the GEMMs' ``LATE`` constexpr: wait at the start, and let the next
    kernel launch only after the K loop."""
    d = pdl_args(t)
    d["LATE"] = d["PDL"] and late
    return d


if triton is not None:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def wait_only(PDL: tl.constexpr):
        """Wait for the previous kernel (and its writes); the next launches at ``launch_next``."""
        if PDL:
            gdc_wait()

    @triton.jit
    def launch_next(PDL: tl.constexpr):
        """Let the next kernel of the chain launch (after ``wait_only``)."""
        if PDL:
            gdc_launch_dependents()

    @triton.jit
    def wait_previous(PDL: tl.constexpr):
        """Wait for the previous kernel (and its writes), then let the next one launch."""
        wait_only(PDL)
        launch_next(PDL)
