"""A stream that falls behind reads its pending deltas as one (``AsyncEngine.generate``)."""

from __future__ import annotations

import asyncio

import pytest

from mmserve import SamplingParams
from mmserve.config import EngineConfig
from mmserve.engine.async_engine import AsyncEngine, _coalesced
from mmserve.engine.outputs import RequestOutput, TokenLogprob, coalesce


def _out(
    ids: list[int],
    text: str,
    upto: list[int],
    finished: bool = False,
    logprobs: list[TokenLogprob] | None = None,
) -> RequestOutput:
    return RequestOutput(
        "r",
        ids,
        text,
        upto,
        "".join(map(str, upto)),
        finished,
        "length" if finished else None,
        5,
        new_logprobs=logprobs,
    )


def test_coalesce_joins_deltas_and_keeps_the_latest_totals():
    lp = TokenLogprob(2, "b", -0.5)
    merged = coalesce([_out([1], "a", [1]), _out([2, 3], "bc", [1, 2, 3], True, [lp])])
    assert (merged.new_token_ids, merged.new_text) == ([1, 2, 3], "abc")
    assert merged.token_ids == [1, 2, 3] and merged.finished and merged.finish_reason == "length"
    assert merged.new_logprobs == [lp]
    assert coalesce([_out([1], "a", [1]), _out([2], "b", [1, 2])]).new_logprobs is None
    one = _out([1], "a", [1])
    assert coalesce([one]) is one


def test_coalesced_stops_at_the_end_and_holds_an_error_back():
    async def go():
        q: asyncio.Queue = asyncio.Queue()
        for item in (_out([2], "b", [1, 2]), _out([3], "c", [1, 2, 3], True), _out([9], "z", [9])):
            q.put_nowait(item)
        item, held = _coalesced(_out([1], "a", [1]), q)
        assert (item.new_text, item.finished, held, q.qsize()) == ("abc", True, None, 1)
        boom = RuntimeError("engine died")
        q2: asyncio.Queue = asyncio.Queue()
        q2.put_nowait(_out([2], "b", [1, 2]))
        q2.put_nowait(boom)
        item, held = _coalesced(_out([1], "a", [1]), q2)
        assert item.new_text == "ab" and held is boom

    asyncio.run(go())


@pytest.mark.timeout(300)
def test_a_slow_reader_gets_fewer_deltas_with_the_same_text(default_model_dir):
    async def go():
        engine = AsyncEngine.from_config(
            EngineConfig(model=str(default_model_dir), device="cpu", connector="none")
        )
        try:
            prompt = engine.tokenizer.encode("Tell me a long story about a dragon.")
            params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
            deltas = []
            async for out in engine.generate(prompt, params):
                deltas.append(out)
                if len(deltas) == 1:
                    while engine.engine.requests:  # fall behind until generation ends
                        await asyncio.sleep(0.05)
            return deltas
        finally:
            await engine.shutdown()

    deltas = asyncio.run(go())
    final = deltas[-1]
    assert final.finished and len(final.token_ids) == 24
    assert len(deltas) == 2  # the first delta, then everything that queued behind it
    assert [t for d in deltas for t in d.new_token_ids] == final.token_ids
    assert "".join(d.new_text for d in deltas) == final.text
