"""Programmatic dependent launch (PDL) for the decode chain's Triton kernels (sm_90+).

A batch-1 decode step is a chain of short kernels, each waiting for the one before it
(bench/NOTES.md, session 4: SmolLM2-135M 185 launches, 1,262 us a step of which 860 us
is kernel time; the Llama-3-8B shape ~390 us of gaps). With PDL a kernel is launched
while its predecessor still runs and waits at ``griddepcontrol.wait`` for the
predecessor to finish and its writes to be visible: the launch and the program start-up
overlap the predecessor's tail. H200, random weights, PDL off and on in the same run
(bench/NOTES.md, session 5): SmolLM2-135M batch 1 +11 to +32 % (off 754-958 tok/s, on
879-1,094 over three runs), the Llama-3-8B shape -1 to +6 % (noise).
Also measured and not kept: prefetching the kernel's weights into L2 before the wait (no
gain at 135M, -5 % at 8B), and loading a thin GEMM tile's first weight block before the
wait (-20 % at 8B when every next block was then loaded by hand one step ahead; with
only the first step peeled off the loop, no change in the model step).

Rules every kernel launched with ``launch_pdl`` here keeps:

- it reads nothing before ``wait_previous``, where the predecessor may still be writing;
- every program runs ``wait_previous`` before it writes or exits, so a grid cannot
  finish before its predecessor has (a chain of waits is then a chain of completions);
- ``wait_previous`` also lets the next kernel launch: at most two kernels of the chain
  are resident, the one computing and the next one, waiting.
- A GEMM launched with ``late`` waits with ``wait_only`` instead and lets the next kernel
  launch with ``launch_next`` after its K loop (the fused GEMMs: after the tile's store),
  so the waiting programs do not hold shared memory and registers while it streams. H200,
  8B batch 1 (bench/NOTES.md, session 16): late for every GEMM cost 3-4 % (the small
  kernels' launches were exposed again); in a timing probe with down right after gate_up
  (silu * up skipped) it turned 4,973-5,042 us a step into 4,492. Off by default;
  ``bench/pdl_trigger_ab.py`` measures where it pays.

Only the launch and the order of memory traffic change: every kernel computes the same
bits with PDL on or off (tests on the GPU compare them). Off on CPU, in the Triton
interpreter, below sm_90, or with ``MMSERVE_PDL=0`` / ``set_pdl_enabled(False)``.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

_state: dict = {"enabled": os.environ.get("MMSERVE_PDL", "1") != "0", "devices": {}}


def set_pdl_enabled(enabled: bool) -> None:
    """Switch programmatic dependent launch on or off for every kernel in the process."""
    _state["enabled"] = enabled


def pdl_launch(t: torch.Tensor) -> bool:
    """Whether kernels working on ``t`` launch with PDL (CUDA, sm_90+, compiled Triton)."""
    if not (_state["enabled"] and t.is_cuda) or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    ok = _state["devices"].get(dev)
    if ok is None:
        ok = _state["devices"][dev] = torch.cuda.get_device_capability(dev)[0] >= 9
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
