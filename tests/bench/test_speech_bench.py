"""``mmserve bench speech``'s pieces: its forced layout writes frames its parser reads back,
and the codec-alone cost is reported a call and a frame at any frames per call."""

from __future__ import annotations

import torch

from mmserve.bench.speech import ForcedLayout, codec_costs
from tts.framecodec import FrameCodec, FrameCodecConfig


def test_forced_layout_reads_back_what_it_writes():
    for tokens_per_frame, codes_per_frame, codebook in ((2, 1, 4375), (7, 7, 4096)):
        lay = ForcedLayout(tokens_per_frame, codes_per_frame, codebook)
        frames = [[(17 * f + c) % codebook for c in range(codes_per_frame)] for f in range(5)]
        tokens = lay.frame_tokens(frames)
        assert len(tokens) == 5 * tokens_per_frame
        assert lay.parser().feed(tokens) == frames


def test_codec_costs_per_call_and_per_frame():
    torch.manual_seed(0)
    codec = FrameCodec(FrameCodecConfig(dec_dim=32, enc_dim=32)).eval()
    costs = codec_costs(codec, [1, 2], frames_per_call=4, steps=2)
    assert sorted(costs) == ["1", "2"]
    for c in costs.values():
        assert c["ms_per_frame"] * 4 == c["ms_per_call"] > 0
        assert c["rtf"] == c["ms_per_frame"] / 1000 / codec.frame_duration
