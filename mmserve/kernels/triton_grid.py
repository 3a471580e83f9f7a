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

The wait is a loop of acquire loads (each one empties the SM's L1) unless the kernel passes
``POLL``, ``poll_asm``'s PTX: with relaxed loads the L1 keeps what the program cached
(launch constants: block tables, rope rows), which the rule above makes safe (and the
loads a program issues after the wait follow a branch on the loaded value and a CTA
barrier). One relaxed load in flight is the fastest wait measured; two to eight loads in
flight or a spin between loads are slower (docs/performance.md).

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


def poll_asm(polls: int, spacing: int, acquire: bool, gap: int = 0) -> str:
    """PTX for ``grid_sync``'s wait: thread 0 loads the counter (``$1``) until it reaches
    the target (``$2``) with ``polls`` loads in flight, issued ``spacing`` SM cycles apart
    (meant to see the last arrival within a round trip / ``polls``: slower, since the
    counter's line then takes ``polls`` times the loads), then
    every thread meets at ``bar.sync 0``. The loads
    are ``ld.acquire.gpu`` (``acquire``) or ``ld.relaxed.gpu``: a relaxed wait orders
    nothing by itself, so it is only for kernels whose every read of another program's
    writes goes to L2 (``.cg``) and is issued after the wait (a branch on the loaded
    value, then the CTA barrier). ``gap``: cycles spun after a load that saw too little,
    before it is issued again (fewer loads on the counter's line). Output ``$0``: 0
    (unused)."""
    sem = "acquire" if acquire else "relaxed"
    load = [f"ld.{sem}.gpu.global.b32 %c{i}, [$1];" for i in range(polls)]

    def spin(label: str, cycles: int) -> list[str]:  # thread 0 idles ``cycles`` SM cycles
        return [
            "mov.u64 %k0, %clock64;",
            f"$${label}${{:uid}}:",
            "mov.u64 %k1, %clock64;",
            "sub.s64 %k1, %k1, %k0;",
            f"setp.lt.s64 %p1, %k1, {cycles};",
            f"@%p1 bra $${label}${{:uid}};",
        ]

    regs = ", ".join(f"%c{i}" for i in range(polls))
    lines = [
        "{",
        ".reg .pred %p<2>;",
        ".reg .b32 %t;",
        f".reg .b32 {regs};",
        ".reg .b64 %k<2>;",
        "mov.u32 $0, 0;",
        "mov.u32 %t, %tid.x;",
        "setp.ne.u32 %p0, %t, 0;",
        "@%p0 bra $$D${:uid};",
    ]
    for i in range(polls):  # ``spacing`` cycles between the first loads
        lines += (spin(f"S{i}", spacing) if i else []) + [load[i]]
    lines.append("$$L${:uid}:")
    for i in range(polls):  # the oldest load's value, then that load again
        lines += [f"setp.ge.s32 %p1, %c{i}, $2;", "@%p1 bra $$D${:uid};"]
        lines += (spin(f"G{i}", gap) if gap else []) + [load[i]]
    lines += ["bra $$L${:uid};", "$$D${:uid}:", "bar.sync 0;", "}"]
    return "\n".join(lines)


def last_release_asm(lines: int, rel: bool = False) -> str:
    """PTX for ``grid_sync_flags``' MODE 1 in one block: thread 0 adds one to the counter
    (``$1``, a returning release atomic), ``bar.red.or`` hands every thread whether it
    was the last arrival (the old value ``$3``, the barrier's count minus one) and meets
    them; the last program's threads then write the barrier number ``$4`` into the
    ``lines`` release words at ``$2`` (one a 128-byte line, thread t the words t and t +
    128), the others' thread 0 loads its word ``$5`` until it holds ``$4``, then
    ``bar.sync 0``. ``rel``: release stores (else relaxed: every read of another
    program's writes after the wait is ``.cg`` and follows the loaded value). Output
    ``$0``: 0 (unused)."""
    st = "st.release.gpu.global.b32" if rel else "st.relaxed.gpu.global.b32"
    return "\n".join(
        [
            "{",
            ".reg .pred %p<6>;",
            ".reg .b32 %t, %o, %w;",
            ".reg .b64 %a;",
            "mov.u32 $0, 0;",
            "mov.u32 %t, %tid.x;",
            "mov.u32 %o, 0;",
            "setp.eq.u32 %p0, %t, 0;",
            "@%p0 atom.release.gpu.global.add.u32 %o, [$1], 1;",
            "setp.eq.and.u32 %p1, %o, $3, %p0;",
            "bar.red.or.pred %p2, 0, %p1;",
            "@!%p2 bra $$W${:uid};",
            f"setp.lt.u32 %p3, %t, {lines};",
            f"setp.lt.u32 %p4, %t, {max(lines - 128, 0)};",
            "mul.wide.u32 %a, %t, 128;",
            "add.s64 %a, %a, $2;",
            f"@%p3 {st} [%a], $4;",
            f"@%p4 {st} [%a+16384], $4;",
            "bra $$D${:uid};",
            "$$W${:uid}:",
            "@!%p0 bra $$B${:uid};",
            "$$L${:uid}:",
            "ld.relaxed.gpu.global.b32 %w, [$5];",
            "setp.lt.s32 %p5, %w, $4;",
            "@%p5 bra $$L${:uid};",
            "$$B${:uid}:",
            "bar.sync 0;",
            "$$D${:uid}:",
            "}",
        ]
    )


if triton is not None:

    @triton.jit
    def grid_sync(counter_ptr, phase, programs, POLL: tl.constexpr = ""):
        """Wait until every program of the grid has arrived at barrier number ``phase``
        (1, 2, ... within a launch); a program's earlier writes are visible after it.
        ``POLL``: ``poll_asm``'s PTX for the wait (else a loop of acquire loads)."""
        tl.debug_barrier()  # the program's threads have all written
        tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
        target = phase * programs
        if POLL == "":
            seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
            while seen < target:
                seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
            tl.debug_barrier()
        else:
            tl.inline_asm_elementwise(
                POLL, "=r,l,r", [counter_ptr, target], dtype=tl.int32, is_pure=False, pack=1
            )

    @triton.jit
    def _release_flags(flags_ptr, phase, LINES: tl.constexpr, NP: tl.constexpr):
        """Write ``phase`` into the ``LINES`` release words (one a 128-byte line), one
        thread a word, relaxed (the waiters' reads of other programs' writes are ``.cg``
        and issued after they see the word)."""
        ptrs = flags_ptr + tl.minimum(tl.arange(0, NP), LINES - 1) * 32
        tl.inline_asm_elementwise(
            "mov.u32 $0, 0;\n\tst.relaxed.gpu.global.b32 [$1], $2;",
            "=r,l,r",
            [ptrs, tl.full([NP], phase, tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def grid_sync_flags(
        counter_ptr,
        flags_ptr,
        phase,
        programs,
        pid,
        POLL: tl.constexpr,
        MODE: tl.constexpr,
        LINES: tl.constexpr,
        NP: tl.constexpr,
    ):
        """``grid_sync`` with the wait moved off the counter's line: the programs poll
        release words (``flags_ptr``: ``LINES`` words 128 bytes apart, program p polls
        word p % LINES) that one program writes once every program has arrived, so the
        counter's line takes only the arrivals. ``MODE`` 1: each program adds one with a
        returning atomic and the last to arrive writes the words, all of it ``POLL``, a
        ``last_release_asm`` block; 2: the arrivals as ``grid_sync``'s and program 0
        polls the counter, then writes them (``POLL``: ``poll_asm``'s wait). ``NP``: a
        power of two >= ``LINES``. The words hold barrier numbers, so they start at zero
        each launch.

        Slower than ``grid_sync`` in every form, so no kernel uses it: the added trip (the
        atomic's return, or the lead's hop) costs more than the counter's polls do
        (docs/performance.md)."""
        tl.debug_barrier()  # the program's threads have all written
        target = phase * programs
        mine = flags_ptr + (pid % LINES) * 32
        if MODE == 1:  # POLL: ``last_release_asm``'s block
            tl.inline_asm_elementwise(
                POLL,
                "=r,l,l,r,r,l",
                [counter_ptr, flags_ptr, target - 1, phase, mine],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )
        else:
            tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
            if pid == 0:
                tl.inline_asm_elementwise(
                    POLL, "=r,l,r", [counter_ptr, target], dtype=tl.int32, is_pure=False, pack=1
                )
                _release_flags(flags_ptr, phase, LINES, NP)
                tl.debug_barrier()
            else:
                tl.inline_asm_elementwise(
                    POLL, "=r,l,r", [mine, phase], dtype=tl.int32, is_pure=False, pack=1
                )

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
            tl.inline_asm_elementwise(
                "mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];",
                "=r,l",
                [ptrs],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )

        @triton.jit
        def prefetch_l1(ptrs):
            """Ask the SM's L1 for the lines holding ``ptrs`` and go on (``prefetch.global.L1``):
            a later load of them in this phase hits L1 instead of waiting on L2. Only for lines
            no program writes while they may sit in L1 (an L1 line is not kept coherent)."""
            tl.inline_asm_elementwise(
                "mov.u32 $0, 0;\n\tprefetch.global.L1 [$1];",
                "=r,l",
                [ptrs],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )

    @triton.jit
    def prefetch_share(ptr, numel, worker, workers, LINE: tl.constexpr, LINES: tl.constexpr):
        """``worker``'s share (every ``workers``-th 128-byte line, ``LINES`` of them at most)
        of the ``numel`` elements at ``ptr`` (``LINE`` elements a line), into L2."""
        i = worker + workers * tl.arange(0, LINES).to(tl.int64)
        prefetch_l2(ptr + tl.minimum(i * LINE, numel - 1))
