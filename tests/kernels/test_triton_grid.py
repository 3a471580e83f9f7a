"""The grid barrier of the persistent kernels (GPU only: the interpreter runs programs one
after another, so no grid of several programs can meet there).

The barrier's two promises: no program leaves before all have arrived, and what a
program wrote before it arrived is what the others read after they leave. On CPU, every
form of the wait's PTX (``poll_asm``) goes through Triton's sm_90 compile and ptxas.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
from triton_kit import COMPILES, ON_CUDA

needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="needs CUDA + triton")

if ON_CUDA or COMPILES:
    import triton
    import triton.language as tl

    from mmserve.kernels.triton_grid import (
        grid_sync,
        grid_sync_flags,
        last_release_asm,
        poll_asm,
    )

    @triton.jit
    def _rounds(
        counter_ptr,
        flags_ptr,
        buf_ptr,
        err_ptr,
        R,
        P: tl.constexpr,
        P2: tl.constexpr,
        POLL: tl.constexpr,
        MODE: tl.constexpr = 0,
        LINES: tl.constexpr = 1,
        NP: tl.constexpr = 128,
    ):
        """Each round every program writes a word, passes the barrier (``grid_sync``; MODE
        1-2: ``grid_sync_flags``' on the release words at ``flags_ptr``) and reads every
        program's word of that round (a stale one counts as an error); the words
        alternate between two halves so a round's writes never race the last's reads."""
        pid = tl.program_id(0)
        others = tl.arange(0, P2)
        mine = others < P
        errors = 0
        for r in range(R):
            half = (r % 2) * P2
            tl.store(buf_ptr + half + pid, r * 1000 + pid)
            if MODE == 0:
                grid_sync(counter_ptr, r + 1, P, POLL)
            else:
                grid_sync_flags(counter_ptr, flags_ptr, r + 1, P, pid, POLL, MODE, LINES, NP)
            seen = tl.load(buf_ptr + half + others, mask=mine, other=-1, cache_modifier=".cg")
            errors += tl.sum(tl.where(mine & (seen != r * 1000 + others), 1, 0))
        tl.store(err_ptr + pid, errors)


# the wait: acquire loads one at a time (the default), or poll_asm's (loads in flight,
# cycles between them, acquire)
POLLS = [None, (1, 0, False), (1, 0, True), (4, 100, False), (4, 100, True), (8, 60, False)]


@needs_cuda
@pytest.mark.parametrize("poll", POLLS)
@pytest.mark.parametrize("programs", [1, 7, 64, 1000])
def test_grid_sync_orders_writes_and_reads(programs, poll):
    programs = min(programs, torch.cuda.get_device_properties(0).multi_processor_count)
    p2 = triton.next_power_of_2(programs)
    rounds = 300
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    buf = torch.full((2 * p2,), -1, dtype=torch.int32, device="cuda")
    err = torch.full((programs,), -1, dtype=torch.int32, device="cuda")
    _rounds[(programs,)](
        counter,
        counter,
        buf,
        err,
        rounds,
        P=programs,
        P2=p2,
        POLL=poll_asm(*poll) if poll else "",
        num_warps=4,
    )
    torch.cuda.synchronize()
    assert int(counter) == rounds * programs
    assert err.tolist() == [0] * programs


@pytest.mark.skipif(not COMPILES, reason="needs triton (not its interpreter)")
@pytest.mark.parametrize("poll", POLLS[1:] + [(1, 0, False, 150), (2, 200, True, 50)])
def test_poll_asm_compiles_for_sm90(poll, tmp_path):
    """The wait's PTX in the barrier's kernel: Triton's sm_90 compile and ptxas take it, each
    load of the counter is there (``polls`` issued before the loop, one again in it each),
    with its memory order, and every thread meets at one CTA barrier after it."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {
        "counter_ptr": "*i32",
        "flags_ptr": "*i32",
        "buf_ptr": "*i32",
        "err_ptr": "*i32",
        "R": "i32",
        "P": "constexpr",
        "P2": "constexpr",
        "POLL": "constexpr",
        "MODE": "constexpr",
        "LINES": "constexpr",
        "NP": "constexpr",
    }
    src = ASTSource(
        _rounds,
        signature=sig,
        constexprs={"P": 96, "P2": 128, "POLL": poll_asm(*poll), "MODE": 0, "LINES": 1, "NP": 128},
    )
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    sem = "acquire" if poll[2] else "relaxed"
    assert ptx.count(f"ld.{sem}.gpu.global.b32") == 2 * poll[0]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    subprocess.run(
        [ptxas, "-arch=sm_90a", str(path), "-o", str(tmp_path / "k.cubin")],
        check=True,
        capture_output=True,
    )


# the wait on release words: (MODE, lines; 0: one a program), grid_sync_flags
FLAG_FORMS = [(1, 0), (1, 8), (1, 1), (2, 0), (2, 8)]


def _flags_poll(mode: int, lines: int) -> str:
    return last_release_asm(lines) if mode == 1 else poll_asm(1, 0, False)


@needs_cuda
@pytest.mark.parametrize("form", FLAG_FORMS)
@pytest.mark.parametrize("programs", [1, 7, 64, 1000])
def test_grid_sync_flags_orders_writes_and_reads(programs, form):
    """The barrier whose programs wait on release words keeps both promises, and every
    word ends at the last barrier's number."""
    programs = min(programs, torch.cuda.get_device_properties(0).multi_processor_count)
    p2 = triton.next_power_of_2(programs)
    mode, lines = form
    lines = lines or programs
    rounds = 300
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    flags = torch.zeros(32 * lines, dtype=torch.int32, device="cuda")
    buf = torch.full((2 * p2,), -1, dtype=torch.int32, device="cuda")
    err = torch.full((programs,), -1, dtype=torch.int32, device="cuda")
    _rounds[(programs,)](
        counter,
        flags,
        buf,
        err,
        rounds,
        P=programs,
        P2=p2,
        POLL=_flags_poll(mode, lines),
        MODE=mode,
        LINES=lines,
        NP=max(triton.next_power_of_2(lines), 128),
        num_warps=4,
    )
    torch.cuda.synchronize()
    assert int(counter) == rounds * programs
    assert err.tolist() == [0] * programs
    assert flags.view(lines, 32)[:, 0].tolist() == [rounds] * lines


@pytest.mark.skipif(not COMPILES, reason="needs triton (not its interpreter)")
@pytest.mark.parametrize("form", FLAG_FORMS + [(1, 132)])
def test_grid_sync_flags_compiles_for_sm90(form, tmp_path):
    """The release-word barrier's PTX goes through Triton's sm_90 compile and ptxas: one
    counter atomic, the words' stores (two a thread past 128 words) and one poll loop."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    mode, lines = form
    lines = lines or 96
    sig = {
        "counter_ptr": "*i32",
        "flags_ptr": "*i32",
        "buf_ptr": "*i32",
        "err_ptr": "*i32",
        "R": "i32",
        "P": "constexpr",
        "P2": "constexpr",
        "POLL": "constexpr",
        "MODE": "constexpr",
        "LINES": "constexpr",
        "NP": "constexpr",
    }
    src = ASTSource(
        _rounds,
        signature=sig,
        constexprs={
            "P": max(lines, 96),
            "P2": 256,
            "POLL": _flags_poll(mode, lines),
            "MODE": mode,
            "LINES": lines,
            "NP": max(triton.next_power_of_2(lines), 128),
        },
    )
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    assert ptx.count("atom.global.gpu.release.add") + ptx.count("atom.release.gpu.global.add") == 1
    assert ptx.count("st.relaxed.gpu.global.b32") == (2 if mode == 1 else 1)
    # poll_asm: a load before its loop and one in it, the lead's wait and the others'
    assert ptx.count("ld.relaxed.gpu.global.b32") == (1 if mode == 1 else 4)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    subprocess.run(
        [ptxas, "-arch=sm_90a", str(path), "-o", str(tmp_path / "k.cubin")],
        check=True,
        capture_output=True,
    )
