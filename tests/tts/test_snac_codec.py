"""SNAC 24 kHz: parity with the ``snac`` package on one random state dict, and streaming
decode (any chunking, streams of different ages in one batch) equal to the whole decode.

The network is SNAC 24 kHz's (rates, strides, kernels, dilations, depthwise convs, noise
blocks: so the same 4,757-sample lookahead) at narrow widths (latent 64, decoder 64
channels), which keeps the test fast; the width changes no code path.

Tolerances: parity and streaming-vs-whole within 1e-5 absolute on outputs of ~0.1 peak
(float32; the only differences are summation order and the folded weight norm). The
reference's ``torch.randn`` noise is replaced, for the reference call only, by the values
our decoder uses (a function of seed, block and sample time), so the noise path is
compared too.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tts.slots import CodecSlots
from tts.snac import SNAC, SNACConfig, fold_weight_norm
from tts.streaming import gaussian_noise

snac_ref = pytest.importorskip("snac")

TOL = 1e-5
CFG = dict(
    sampling_rate=24000,
    encoder_dim=4,
    encoder_rates=[2, 4, 8, 8],
    decoder_dim=64,
    decoder_rates=[8, 8, 4, 2],
    attn_window_size=None,
    codebook_size=4096,
    codebook_dim=8,
    vq_strides=[4, 2, 1],
    noise=True,
    depthwise=True,
)


@pytest.fixture(scope="module")
def models():
    """The reference SNAC 24 kHz and ours, loaded from the same random state dict (random
    snake alphas too; the last conv scaled so tanh is not saturated)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = snac_ref.SNAC(**CFG).eval()
    sd = ref.state_dict()
    g = torch.Generator().manual_seed(1)
    for k, v in sd.items():
        if k.endswith("alpha"):
            sd[k] = 0.5 + torch.rand(v.shape, generator=g)
    sd["decoder.model.7.parametrizations.weight.original0"] *= 0.1
    ref.load_state_dict(sd)
    return ref, SNAC.from_state_dict(sd, SNACConfig.from_dict(CFG)), sd


def _codes(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 4096, (b, t, 7), generator=torch.Generator().manual_seed(seed))


def _reference(ref, ours: SNAC, codes: torch.Tensor, seeds: list[int]) -> torch.Tensor:
    calls = [0]
    real_randn = torch.randn

    def noise(shape, device=None, dtype=None, **_):
        b, _, n = shape
        block, calls[0] = calls[0], calls[0] + 1
        return gaussian_noise(
            torch.tensor(seeds), block, torch.arange(n).expand(b, n), dtype or torch.float32
        )

    torch.randn = noise  # the reference's NoiseBlock draws through torch.randn
    try:
        with torch.inference_mode():
            out = ref.decode(ours.levels(codes))[:, 0]
    finally:
        torch.randn = real_randn
    assert calls[0] == 4, "one draw per decoder block"
    return out


def test_whole_decode_matches_snac_package(models):
    ref, ours, _ = models
    codes = _codes(2, 5, 2)
    want = _reference(ref, ours, codes, [3, 11])
    got = ours.decode(codes, seeds=[3, 11])
    assert got.shape == (2, 5 * 2048) and ours.frame_samples == 2048
    assert want.abs().max() > 0.01 and (want.abs() > 0.99).float().mean() < 0.01
    assert (got - want).abs().max().item() < TOL


def test_old_weight_norm_layout_loads_the_same(models):
    _, ours, sd = models
    old = {}
    for k, v in sd.items():
        k = k.replace(".parametrizations.weight.original0", ".weight_g")
        old[k.replace(".parametrizations.weight.original1", ".weight_v")] = v
    again = SNAC.from_state_dict(old, SNACConfig.from_dict(CFG))
    assert fold_weight_norm(old).keys() == fold_weight_norm(sd).keys()
    codes = _codes(1, 2, 3)
    assert torch.equal(again.decode(codes), ours.decode(codes))


@pytest.mark.parametrize("chunks", [[1] * 6, [2, 3, 1], [6]])
def test_streaming_equals_whole(models, chunks):
    _, ours, _ = models
    codes = _codes(2, sum(chunks), 4)
    whole = ours.decode(codes, seeds=[1, 2]).numpy()
    state = ours.init_state(2, seeds=[1, 2])
    got: list[list[np.ndarray]] = [[], []]
    at = 0
    for n in chunks:
        for r, pcm in enumerate(ours.step(codes[:, at : at + n], state).rows()):
            got[r].append(pcm)
        at += n
    for r, pcm in enumerate(ours.flush(state).rows()):
        got[r].append(pcm)
    for r in range(2):
        stream = np.concatenate(got[r])
        assert stream.shape == whole[r].shape
        assert np.abs(stream - whole[r]).max() < TOL


def test_lookahead_is_three_frames(models):
    """A sample is final once 4,757 later samples' codes are in: 3 frames of 2,048."""
    _, ours, _ = models
    assert ours.delay_samples == 4757 and ours.lookahead_frames == 3
    state = ours.init_state(1)
    sizes = [len(ours.step(_codes(1, 1, 5 + i), state).rows()[0]) for i in range(4)]
    assert sizes == [0, 0, 3 * 2048 - 4757, 2048]


def test_slots_batch_streams_of_different_ages(models):
    """Stream B joins two frames after stream A; both decode in shared batched steps and
    each equals its own whole decode."""
    _, ours, _ = models
    a, b = _codes(1, 5, 6), _codes(1, 4, 7)
    slots = CodecSlots(ours, capacity=3)
    sa = slots.open(seed=8)
    out = {sa: slots.step([sa], a[:, 0:1]) + slots.step([sa], a[:, 1:2])}
    sb = slots.open(seed=9)
    out[sb] = []
    for t in range(3):
        pb, pa = slots.step([sb, sa], torch.cat([b[:, t : t + 1], a[:, t + 2 : t + 3]]))
        out[sa].append(pa)
        out[sb].append(pb)
    (tail_a,) = slots.close([sa])
    out[sa].append(tail_a)
    out[sb] += slots.step([sb], b[:, 3:4]) + slots.close([sb])
    assert slots.num_free == 3
    for slot, codes, seed in ((sa, a, 8), (sb, b, 9)):
        whole = ours.decode(codes, seeds=[seed])[0].numpy()
        assert np.abs(np.concatenate(out[slot]) - whole).max() < TOL


def test_a_slot_reopens_after_every_slot_stepped_together(models):
    """A step of every slot, in slot order, hands the codec the state itself, whose
    buffers it may replace with inference tensors; a stream opened in a freed slot
    afterwards still starts afresh (this raised on the in-place reset) and decodes as its
    own whole decode."""
    _, ours, _ = models
    a, b, c = _codes(1, 3, 6), _codes(1, 3, 7), _codes(1, 3, 8)
    slots = CodecSlots(ours, capacity=2)
    sa, sb = slots.open(seed=1), slots.open(seed=2)
    assert [sa, sb] == [0, 1]
    for t in range(3):
        slots.step([sa, sb], torch.cat([a[:, t : t + 1], b[:, t : t + 1]]))
    slots.close([sa])
    sc = slots.open(seed=3)
    out = [p for t in range(3) for p in slots.step([sc], c[:, t : t + 1])] + slots.close([sc])
    whole = ours.decode(c, seeds=[3])[0].numpy()
    assert np.abs(np.concatenate(out) - whole).max() < TOL
