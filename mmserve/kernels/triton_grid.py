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

import os

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

    if os.environ.get("TRITON_INTERPRET") == "1":  # no inline PTX there; a hint changes nothing

        @triton.jit
        def prefetch_l2(ptrs):
            pass

        @triton.jit
        def prefetch_l1(ptrs):
            pass
    else:

        @triton.jit
        def prefetch_l2(ptrs):
            """Ask L2 for the lines holding ``ptrs`` (any shape of pointers) and go on: no
            register waits for them (``prefetch.global.L2``), so a program can fetch what a
            later phase reads while it works or waits at a barrier."""
            tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l",
                                      [ptrs], dtype=tl.int32, is_pure=False, pack=1)

        @triton.jit
        def prefetch_l1(ptrs):
            """Ask the SM's L1 for the lines holding ``ptrs`` and go on (``prefetch.global.L1``):
            a later load of them in this phase hits L1 instead of waiting on L2. Only for lines
            no program writes while they may sit in L1 (an L1 line is not kept coherent)."""
            tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L1 [$1];", "=r,l",
                                      [ptrs], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def prefetch_share(ptr, numel, worker, workers, LINE: tl.constexpr, LINES: tl.constexpr):
        """``worker``'s share (every ``workers``-th 128-byte line, ``LINES`` of them at most)
        of the ``numel`` elements at ``ptr`` (``LINE`` elements a line), into L2."""
        i = worker + workers * tl.arange(0, LINES).to(tl.int64)
        prefetch_l2(ptr + tl.minimum(i * LINE, numel - 1))
