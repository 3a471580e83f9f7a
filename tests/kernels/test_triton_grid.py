"""The grid barrier of the persistent kernels (GPU only: the interpreter runs programs one
after another, so no grid of several programs can meet there).

The barrier's two promises: no program leaves before all have arrived, and what a
program wrote before it arrived is what the others read after they leave.
"""

from __future__ import annotations

import pytest
import torch
from triton_kit import ON_CUDA

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="needs CUDA + triton")

if ON_CUDA:
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
