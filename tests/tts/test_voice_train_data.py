"""The training data stage: sentences encoded together get the codes each has alone."""

from __future__ import annotations

import numpy as np
import torch

from tts.framecodec import FrameCodec, FrameCodecConfig


def test_padded_batch_encode_equals_each_row_alone():
    torch.manual_seed(0)
    codec = FrameCodec(FrameCodecConfig()).eval()
    hop = codec.cfg.hop
    latents: list[torch.Tensor] = []  # the encoder's output, before FSQ rounds it
    quantize = codec.fsq.quantize
    codec.fsq.quantize = lambda z: (latents.append(z), quantize(z))[1]
    # lengths on and off frame boundaries, one a single frame, one much longer
    lengths = [hop * 37, hop * 37 + 1, hop * 5 - 7, hop, hop * 90 + 123]
    rng = np.random.default_rng(3)
    wavs = [rng.standard_normal(n).astype(np.float32) * 0.1 for n in lengths]
    x = np.zeros((len(wavs), max(lengths)), np.float32)
    for b, w in enumerate(wavs):
        x[b, : len(w)] = w
    with torch.inference_mode():
        together = codec.encode(torch.from_numpy(x), lengths)
        codec.encode(torch.from_numpy(x))  # no lengths: the padding read as audio
        z_together, z_unmasked = latents
        for b, w in enumerate(wavs):
            alone = codec.encode(torch.from_numpy(w)[None])
            n = -(-len(w) // hop)
            assert alone.codes.shape[1] == n
            assert torch.equal(together.codes[b, :n], alone.codes[0])
            torch.testing.assert_close(z_together[b, :n], latents[-1][0], atol=1e-5, rtol=1e-5)
            if n < x.shape[1] // hop:  # a padded row: its last frame saw the padding
                assert (z_unmasked[b, n - 1] - latents[-1][0, -1]).abs().max() > 1e-3
