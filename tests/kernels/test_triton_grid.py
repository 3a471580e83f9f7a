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

    from mmserve.kernels.triton_grid import grid_sync, poll_asm

    @triton.jit
    def _rounds(counter_ptr, buf_ptr, err_ptr, R, P: tl.constexpr, P2: tl.constexpr,
                POLL: tl.constexpr):
        """Each round every program writes a word, passes the barrier and reads every
        program's word of that round (a stale one counts as an error); the words
        alternate between two halves so a round's writes never race the last's reads."""
        pid = tl.program_id(0)
        others = tl.arange(0, P2)
        mine = others < P
        errors = 0
        for r in range(R):
            half = (r % 2) * P2
            tl.store(buf_ptr + half + pid, r * 1000 + pid)
            grid_sync(counter_ptr, r + 1, P, POLL)
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
    _rounds[(programs,)](counter, buf, err, rounds, P=programs, P2=p2,
                         POLL=poll_asm(*poll) if poll else "", num_warps=4)
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

    sig = {"counter_ptr": "*i32", "buf_ptr": "*i32", "err_ptr": "*i32", "R": "i32",
           "P": "constexpr", "P2": "constexpr", "POLL": "constexpr"}
    src = ASTSource(_rounds, signature=sig,
                    constexprs={"P": 96, "P2": 128, "POLL": poll_asm(*poll)})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4}).asm["ptx"]
    sem = "acquire" if poll[2] else "relaxed"
    assert ptx.count(f"ld.{sem}.gpu.global.b32") == 2 * poll[0]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    subprocess.run([ptxas, "-arch=sm_90a", str(path), "-o", str(tmp_path / "k.cubin")],
                   check=True, capture_output=True)
