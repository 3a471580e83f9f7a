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

    from mmserve.kernels.triton_grid import grid_sync

    @triton.jit
    def _rounds(counter_ptr, buf_ptr, err_ptr, R, P: tl.constexpr, P2: tl.constexpr):
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
            grid_sync(counter_ptr, r + 1, P)
            seen = tl.load(buf_ptr + half + others, mask=mine, other=-1, cache_modifier=".cg")
            errors += tl.sum(tl.where(mine & (seen != r * 1000 + others), 1, 0))
        tl.store(err_ptr + pid, errors)


@pytest.mark.parametrize("programs", [1, 7, 64, 1000])
def test_grid_sync_orders_writes_and_reads(programs):
    programs = min(programs, torch.cuda.get_device_properties(0).multi_processor_count)
    p2 = triton.next_power_of_2(programs)
    rounds = 300
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    buf = torch.full((2 * p2,), -1, dtype=torch.int32, device="cuda")
    err = torch.full((programs,), -1, dtype=torch.int32, device="cuda")
    _rounds[(programs,)](counter, buf, err, rounds, P=programs, P2=p2, num_warps=4)
    torch.cuda.synchronize()
    assert int(counter) == rounds * programs
    assert err.tolist() == [0] * programs
