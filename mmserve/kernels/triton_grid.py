"""A grid-wide barrier for persistent Triton kernels (every program resident at once).

A persistent kernel runs a fixed grid of at most one program per SM and loops over its
work; phases that read what other programs wrote are separated by ``grid_sync``. The
barrier is a monotonically growing counter in global memory: each program adds one
(release, so its writes are visible first), then spins until the counter reaches
``phase * programs`` (acquire). The counter starts at zero for each launch (the
launcher zeroes it; a CUDA graph captures that as a memset).

Rules for the kernels that use it:

- the grid must fit on the device at once (``programs <= SM count``, one program per
  SM's resources), or the programs already spinning wait for ones that never start;
- data written in the launch by other programs is read with ``cache_modifier=".cg"``
  (L2, not the SM's incoherent L1, which may hold a line from before the write).

Under the Triton interpreter programs run one after another, so only a grid of one
program can pass a barrier there (tests use that to check the arithmetic on CPU).
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None


if triton is not None:

    @triton.jit
    def grid_sync(counter_ptr, phase, programs):
        """Wait until every program of the grid has arrived at barrier number ``phase``
        (1, 2, ... within a launch); a program's earlier writes are visible after it."""
        tl.debug_barrier()  # the program's threads have all written
        tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
        target = phase * programs
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
