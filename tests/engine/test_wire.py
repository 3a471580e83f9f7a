"""The engine-core wire (``mmserve.engine.wire``): every message decodes to what was sent.

No model, no process: encode, decode, compare field by field, tensors bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmserve import errors
from mmserve.engine import wire
from mmserve.engine.outputs import EngineStats, RequestOutput, TokenLogprob
from mmserve.engine.playback import AudioSpec
from mmserve.engine.request import EmbeddingSpan
from mmserve.sampling_params import SamplingParams
from mmserve.structured.spec import StructuredOutput


def _round_trip(msg: object, kind: object) -> object:
    return wire.decoder(kind).decode(wire.encoder().encode(msg))


def test_add_keeps_params_spans_and_audio() -> None:
    params = SamplingParams(
        temperature=0.7,
        top_k=5,
        seed=3,
        stop=["\n\n"],
        logit_bias={42: -1.5},
        logprobs=2,
        structured=StructuredOutput("regex", "[ab]+"),
    )
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randn(3, 8, 8, generator=gen).to(torch.bfloat16)
    span = EmbeddingSpan(4, None, b"d" * 16, pixels, b"s" * 16, 9, 2)
    audio = AudioSpec("stream-1", 0.08, 2, buffer_s=0.3, last=False)
    msg = wire.Add(wire.LLM, "r1", [1, 2, 3], params, wire.to_wire([span]), 7, audio)
    got = _round_trip(msg, wire.ToCore)
    assert isinstance(got, wire.Add)
    assert got.params == params and got.audio == audio and got.stage_seed == 7
    (back,) = wire.from_wire(got.spans) or []
    assert back.payload.dtype == torch.bfloat16
    assert torch.equal(back.payload.view(torch.int16), pixels.view(torch.int16))
    assert (back.start, back.digest, back.source, back.length, back.offset) == (
        4,
        b"d" * 16,
        b"s" * 16,
        9,
        2,
    )


def test_outputs_keep_logprobs_and_audio() -> None:
    pcm = np.random.default_rng(0).standard_normal(480).astype(np.float32)
    out = RequestOutput(
        "r1",
        [5, 6],
        "ab",
        [],
        "",
        True,
        "stop",
        11,
        num_cached_tokens=4,
        new_logprobs=[TokenLogprob(5, "a", -0.25, [(5, "a", -0.25)])],
        stop_reason="\n",
        arrival_time=1.5,
        first_token_time=2.0,
        audio=pcm,
    )
    got = _round_trip(wire.Outputs(wire.VOICE, [out]), wire.FromCore)
    assert isinstance(got, wire.Outputs) and got.engine == wire.VOICE
    (back,) = got.outputs
    assert np.array_equal(back.audio, pcm)
    back.audio, out.audio = None, None
    back.new_logprobs[0].top = [tuple(t) for t in back.new_logprobs[0].top]
    assert back == out


def test_health_and_failures() -> None:
    stats = EngineStats(10, 2, 8, 1, 0, 0, 5, 6, 0, 5, spec_acceptance_by_position=[0.5])
    got = _round_trip(wire.Health(3, True, 0.25, [stats]), wire.Health)
    assert got == wire.Health(3, True, 0.25, [stats])
    full = wire.error_from(wire.failure(0, "r", errors.QueueFullError("full")))
    assert isinstance(full, errors.QueueFullError) and str(full) == "full"
    assert isinstance(wire.error_from(wire.failure(0, "r", ValueError("bad"))), ValueError)
    other = wire.error_from(wire.failure(0, "r", OSError("disk")))
    assert isinstance(other, RuntimeError) and "OSError: disk" in str(other)


def test_unknown_objects_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="cannot send"):
        wire.encoder().encode(wire.Abort(0, object()))  # type: ignore[arg-type]
