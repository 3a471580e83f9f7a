"""``SamplingParams(detokenize=False)``: the same token ids, no text (a voice's audio tokens
need no detokenizing), and stop strings refused with it."""

from __future__ import annotations

import pytest
import torch

from mmserve.config import EngineConfig
from mmserve.engine.factory import create_engine
from mmserve.sampling_params import SamplingParams
from tts.random_voice import random_phoneme_voice


def test_detokenize_off_keeps_the_tokens_and_drops_the_text(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: a second intra-op thread only costs
    try:
        _check(tmp_path)
    finally:
        torch.set_num_threads(threads)


def _check(tmp_path) -> None:
    path = random_phoneme_voice(tmp_path / "voice")
    engine = create_engine(EngineConfig(model=str(path), device="cpu", kv_cache_memory_mb=16))
    outs = {}
    for detok in (True, False):
        rid = engine.add_request(
            [1, 5, 6, 3],
            SamplingParams(
                temperature=0, max_tokens=12, detokenize=detok, skip_special_tokens=False
            ),
        )
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished and out.request_id == rid:
                    outs[detok] = out
    assert outs[True].token_ids == outs[False].token_ids and len(outs[False].token_ids) == 12
    assert outs[True].text and outs[False].text == ""
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop=["x"], detokenize=False)
