"""Codec slots' whole-pool pass (``CodecSlots`` with ``recorded_frames``): each call runs
the codec over every slot with a keep mask, as a CUDA graph replays it, and must give the
streams in the call what the gather/scatter path gives them, leave every other slot's
state untouched, and never move the pool's state tensors (a recorded graph holds their
addresses)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tts.framecodec import FrameCodec, FrameCodecConfig
from tts.slots import CodecSlots

CAPACITY = 5


@pytest.fixture(scope="module")
def codec():
    torch.manual_seed(0)
    return FrameCodec(FrameCodecConfig(dec_dim=32, enc_dim=32)).eval()


def _calls(seed: int, steps: int = 14):
    """Random calls: a subset of three open slots, 1 to 6 frames (past the recorded 4)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        slots = sorted(rng.choice(3, size=int(rng.integers(1, 4)), replace=False).tolist())
        yield slots, int(rng.integers(1, 7))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_pass_gives_each_stream_the_gather_scatter_samples(codec, seed):
    plain = CodecSlots(codec, CAPACITY)
    passes = CodecSlots(codec, CAPACITY, recorded_frames=4, whole_pool=True)
    assert sorted(passes._passes) == [1, 2, 3, 4] and not plain._passes
    for pool in (plain, passes):
        assert [pool.open(seed=s) for s in range(3)] == [0, 1, 2]
    ptrs = [b.data_ptr() for b in passes.state.buffers]
    g = torch.Generator().manual_seed(seed)
    for slots, n in _calls(seed):
        codes = torch.randint(0, codec.codebook_size, (len(slots), n, 1), generator=g)
        untouched = [b[[3, 4]].clone() for b in passes.state.buffers]  # never opened
        a, b = plain.step(slots, codes), passes.step(slots, codes)
        assert [len(x) for x in a] == [len(y) for y in b] == [n * codec.frame_samples] * len(slots)
        # the pass runs the codec at the pool's batch, the gather at the call's: rows
        # agree to float rounding, not bits
        assert max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True)) < 1e-5
        after = passes.state.buffers
        assert all(torch.equal(u, s[[3, 4]]) for u, s in zip(untouched, after, strict=True))
        assert [t.data_ptr() for t in passes.state.buffers] == ptrs
    assert np.array_equal(plain.state.frames, passes.state.frames)
    for mine, theirs in zip(plain.state.buffers, passes.state.buffers, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-4)


def test_a_stream_through_the_pass_equals_its_whole_decode(codec):
    """Another stream starts in a reused slot mid-way; each equals its own whole decode,
    and a call of every slot at once keeps the buffers in place too."""
    pool = CodecSlots(codec, 2, recorded_frames=3, whole_pool=True)
    ptrs = [b.data_ptr() for b in pool.state.buffers]
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randint(0, codec.codebook_size, (1, 9, 1), generator=g) for _ in range(3))
    sa, sb = pool.open(seed=0), pool.open(seed=0)
    out_a, out_b = [], []
    for lo, hi in ((0, 1), (1, 3), (3, 6), (6, 9)):  # 1, 2, 3 frames: the pass; then 3
        pa, pb = pool.step([sa, sb], torch.cat([a[:, lo:hi], b[:, lo:hi]]))
        out_a.append(pa)
        out_b.append(pb)
    out_a += pool.close([sa])
    sc = pool.open(seed=0)
    assert sc == sa
    out_c = [p for lo, hi in ((0, 5), (5, 9)) for p in pool.step([sc], c[:, lo:hi])]
    out_c += pool.close([sc])
    for codes, out in ((a, out_a), (b, out_b), (c, out_c)):
        whole = codec.decode(codes)[0].numpy()
        assert np.abs(np.concatenate(out) - whole).max() <= codec.tolerance
    assert [t.data_ptr() for t in pool.state.buffers] == ptrs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="records a CUDA graph")
def test_the_recorded_pass_gives_each_stream_the_gather_scatter_samples(codec):
    dev = torch.device("cuda")
    gpu = FrameCodec(codec.cfg).to(dev).eval()
    gpu.load_state_dict(codec.state_dict())
    plain = CodecSlots(gpu, CAPACITY, whole_pool=False)
    graphs = CodecSlots(gpu, CAPACITY, recorded_frames=4)
    assert sorted(graphs._passes) == [1, 2, 3, 4]
    assert all(p.graph is not None for p in graphs._passes.values())
    for pool in (plain, graphs):
        for s in range(3):
            pool.open(seed=s)
    ptrs = [b.data_ptr() for b in graphs.state.buffers]
    g = torch.Generator().manual_seed(5)
    worst = 0.0
    for slots, n in _calls(5):
        codes = torch.randint(0, gpu.codebook_size, (len(slots), n, 1), generator=g).to(dev)
        a, b = plain.step(slots, codes), graphs.step(slots, codes)
        # cuDNN's convolutions run in TF32 by default, and the pool's batch and the call's
        # round differently (1.6e-5 on an H100; in float32 both paths agree to 6e-7)
        assert max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True)) < 1e-4
        worst = max(worst, max(float(np.abs(x).max()) for x in a))
    assert worst > 1e-2  # the rows compared are signal, not silence
    assert [t.data_ptr() for t in graphs.state.buffers] == ptrs
