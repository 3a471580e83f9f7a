"""A scripted text source with the engine's interface, to control what the "model" says.

It is not a mock of the server or the parsers: the live server runs its real
routes, builders and ``parsers.StreamParser`` on the text; only the text comes
from a script instead of the model. Outputs arrive in uneven chunks (1 to 7
characters) so parsers see tags split at arbitrary points.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from mmserve.engine.outputs import EngineStats, RequestOutput
from mmserve.sampling_params import SamplingParams


def chunks(text: str) -> list[str]:
    out, i, size = [], 0, 1
    while i < len(text):
        out.append(text[i : i + size])
        i += size
        size = size % 7 + 1
    return out


class ScriptedEngine:
    """``generate`` answers each prompt with ``script(prompt_text)``, in uneven chunks."""

    def __init__(self, tokenizer: Any, script: Callable[[str], str], max_model_len: int = 4096):
        self.tokenizer = tokenizer
        self.script = script
        self.model_name = "scripted"
        self.max_model_len = max_model_len
        self.active = 0

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        text = self.script(self.tokenizer.decode(prompt_token_ids))
        pieces = chunks(text)
        self.active += 1
        try:
            sofar = ""
            for k, piece in enumerate(pieces):
                await asyncio.sleep(0)
                sofar += piece
                last = k == len(pieces) - 1
                yield RequestOutput(
                    request_id=request_id or "scripted",
                    new_token_ids=[k],
                    new_text=piece,
                    token_ids=list(range(k + 1)),
                    text=sofar,
                    finished=last,
                    finish_reason="stop" if last else None,
                    num_prompt_tokens=len(prompt_token_ids),
                )
        finally:
            self.active -= 1

    async def abort(self, request_id: str) -> None:
        return None

    def stats(self) -> EngineStats:
        return EngineStats(
            kv_blocks_total=1,
            kv_blocks_used=0,
            kv_blocks_free=1,
            num_running=self.active,
            num_waiting=0,
            preemptions_total=0,
            prompt_tokens_total=0,
            generation_tokens_total=0,
            prefix_cache_hit_tokens_total=0,
            prefix_cache_query_tokens_total=0,
        )
