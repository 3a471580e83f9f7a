"""Orpheus-style voices: the token <-> frame mapping against the reference decoder, and the
whole path (text -> engine tokens -> frames -> PCM) on a tiny Orpheus-shaped checkpoint.

The reference is canopylabs' ``orpheus_tts/decoder.py`` (``turn_token_into_id`` and the
code layout of ``convert_to_audio``), transcribed below; its SNAC decode is the ``snac``
package's. The checkpoint is a 2-layer Llama with Orpheus's 156,940-token vocabulary whose
output is planted (``tts.random_voice``), beside a narrow random SNAC 24 kHz.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tts.layout import OrpheusLayout
from tts.orpheus import AUDIO_BASE, END_OF_SPEECH, START_OF_HUMAN, START_OF_SPEECH
from tts.random_voice import planted_orpheus_voice
from tts.snac import SNAC
from tts.streaming import gaussian_noise

snac_ref = pytest.importorskip("snac")


def ref_turn_token_into_id(token_string: str, index: int) -> int | None:
    token_string = token_string.strip()
    last = token_string.rfind("<custom_token_")
    if last == -1:
        return None
    token = token_string[last:]
    if token.startswith("<custom_token_") and token.endswith(">"):
        return int(token[14:-1]) - 10 - ((index % 7) * 4096)
    return None


def ref_codes(token_ids: list[int]) -> list[list[int]]:
    """The reference's token stream -> its three code rows (``convert_to_audio``)."""
    buffer: list[int] = []
    for t in token_ids:
        code = ref_turn_token_into_id(f"<custom_token_{t - 128256}>", len(buffer))
        if code is not None and code > 0:
            buffer.append(code)
    c0, c1, c2 = [], [], []
    for j in range(len(buffer) // 7):
        f = buffer[7 * j : 7 * j + 7]
        c0.append(f[0])
        c1 += [f[1], f[4]]
        c2 += [f[2], f[3], f[5], f[6]]
    return [c0, c1, c2]


def _frames(n: int, seed: int) -> list[list[int]]:
    """Frames of distinct codes in 1..4095 (the reference drops code 0)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randperm(4095, generator=g)[: 7 * n] + 1
    return codes.view(n, 7).tolist()


def _ref_decode(model, rows: list[list[int]], seed: int = 0) -> np.ndarray:
    calls = [0]
    real = torch.randn

    def noise(shape, device=None, dtype=None, **_):
        b, _, n = shape
        block, calls[0] = calls[0], calls[0] + 1
        return gaussian_noise(torch.tensor([seed]), block, torch.arange(n)[None], torch.float32)

    torch.randn = noise
    try:
        with torch.inference_mode():
            return model.decode([torch.tensor([r]) for r in rows])[0, 0].numpy()
    finally:
        torch.randn = real


def test_frame_tokens_read_back_as_the_reference_reads_them():
    frames = _frames(5, 0)
    tokens = OrpheusLayout().frame_tokens(frames)
    assert len(tokens) == 35 and all(AUDIO_BASE <= t < AUDIO_BASE + 7 * 4096 for t in tokens)
    parser = OrpheusLayout().parser()
    got = [f for t in tokens for f in parser.feed([t])]  # one token at a time
    assert got == frames
    snac = SNAC()
    levels = snac.levels(torch.tensor([frames]))
    assert [lv[0].tolist() for lv in levels] == ref_codes(tokens)


def test_parser_skips_tokens_outside_their_slot():
    frames = _frames(2, 1)
    tokens = OrpheusLayout().frame_tokens(frames)
    noisy = [128000, tokens[0], END_OF_SPEECH, *tokens[1:9], AUDIO_BASE + 6 * 4096, *tokens[9:]]
    assert OrpheusLayout().parser().feed(noisy) == frames


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    frames = _frames(4, 2)
    tokens = OrpheusLayout().frame_tokens(frames) + [END_OF_SPEECH]
    path = planted_orpheus_voice(tmp_path_factory.mktemp("orpheus"), tokens, hidden=64)
    return path, frames, tokens


def test_engine_speaks_the_planted_frames_as_the_reference_decodes_them(planted):
    from tts.synthesizer import Synthesizer

    path, frames, tokens = planted
    synth = Synthesizer(
        str(path), device="cpu", kv_cache_memory_mb=64, max_num_seqs=4, batch_invariant=False
    )
    prompt = synth.voice.prompts("Hello there.", "leo")[0]
    assert prompt[0] == START_OF_HUMAN and prompt[-1] == START_OF_SPEECH
    audio = synth.synthesize("Hello there.", speaker="leo")
    codec = synth.stage.codec
    whole = codec.decode(torch.tensor([frames]))[0].numpy()
    assert audio.sample_rate == 24000 and len(audio.samples) == 4 * 2048
    assert 0.01 < whole.std() and np.abs(whole).max() < 0.99
    assert np.abs(audio.samples - whole).max() < 1e-5  # streamed == whole
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = snac_ref.SNAC(
            **{
                **codec.cfg.__dict__,
                "encoder_rates": [2, 4, 8, 8],
                "decoder_rates": [8, 8, 4, 2],
                "vq_strides": [4, 2, 1],
            }
        )
    from safetensors.torch import load_file

    ref_sd = ref.state_dict()
    ours = load_file(str(path / "snac" / "model.safetensors"))
    ref.load_state_dict(_unfold(ref_sd, ours), strict=False)
    ref.eval()
    want = _ref_decode(ref, ref_codes(tokens))
    assert np.abs(audio.samples - want).max() < 1e-4
    assert synth.engine.stats().kv_blocks_used == 0 and synth.stage.slots.num_free == 4


def _unfold(ref_sd: dict, ours: dict) -> dict:
    """Our folded ``X.weight`` as the reference's weight-norm pair (g = |w|, v = w)."""
    out = {}
    for key in ref_sd:
        base = key.removesuffix(".parametrizations.weight.original0").removesuffix(
            ".parametrizations.weight.original1"
        )
        w = ours.get(base + ".weight") if base != key else ours.get(key)
        if w is None:
            continue
        if key.endswith("original0"):
            out[key] = w.norm(dim=tuple(range(1, w.dim())), keepdim=True)
        else:
            out[key] = w
    return out
