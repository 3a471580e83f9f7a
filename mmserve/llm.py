"""The offline Python API, shaped like vLLM's::

from mmserve import LLM, SamplingParams
llm = LLM()                                  # the default model
outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
print(outs[0].text, outs[0].token_ids, outs[0].finish_reason)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from mmserve.config import EngineConfig
from mmserve.engine.engine import LLMEngine
from mmserve.engine.factory import create_engine
from mmserve.engine.outputs import RequestOutput
from mmserve.engine.request import EmbeddingSpan
from mmserve.sampling_params import SamplingParams

Message = dict[str, Any]


@dataclass
class CompletionOutput:
    """One generated sequence; ``index`` is its place among the ``n`` of its prompt."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list | None = None


@dataclass
class GenerationResult:
    """What one input produced. ``text``/``token_ids``/``finish_reason`` are the first
    sequence's; ``outputs`` holds all ``n``."""

    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


class LLM:
    """Load a model (``None``: the default model) and generate in batches."""

    def __init__(self, model: str | None = None, **engine_options: Any) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(engine_options) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; allowed: {sorted(known)}")
        self.engine: LLMEngine = create_engine(EngineConfig(model=model, **engine_options))
        self.tokenizer = self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | None = None,
        spans: list[list[EmbeddingSpan]] | None = None,
    ) -> list[GenerationResult]:
        """One result per prompt (a string or a list of token ids), in input order."""
        batch = [prompts] if isinstance(prompts, str) or _is_ids(prompts) else list(prompts)
        ids = [
            p if _is_ids(p) else self.tokenizer.encode(p, add_special_tokens=True) for p in batch
        ]
        texts = [p if isinstance(p, str) else None for p in batch]
        return self._run(texts, ids, params or SamplingParams(), spans)  # type: ignore[arg-type]

    def chat(
        self,
        conversations: list[Message] | Sequence[list[Message]],
        params: SamplingParams | None = None,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[GenerationResult]:
        """One result per conversation (a list of ``{"role", "content"}`` messages)."""
        convs = (
            [conversations]
            if conversations and isinstance(conversations[0], dict)
            else list(conversations)
        )
        texts = [
            self.tokenizer.apply_chat_template(
                c,
                tools=tools,  # type: ignore[arg-type]
                add_generation_prompt=add_generation_prompt,
            )
            for c in convs
        ]
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return self._run(texts, ids, params or SamplingParams(), None)  # type: ignore[arg-type]

    def _run(
        self,
        texts: list[str | None],
        ids: list[list[int]],
        params: SamplingParams,
        spans: list[list[EmbeddingSpan]] | None,
    ) -> list[GenerationResult]:
        if spans is not None and len(spans) != len(ids):
            raise ValueError(f"spans has {len(spans)} entries for {len(ids)} prompts")
        order: dict[str, tuple[int, int]] = {}
        for i, prompt in enumerate(ids):
            for j in range(params.n):
                choice = params if params.n == 1 else _choice(params, j)
                rid = self.engine.add_request(prompt, choice, None, spans[i] if spans else None)
                order[rid] = (i, j)
        finals: dict[str, RequestOutput] = {}
        try:
            while len(finals) < len(order):
                for out in self.engine.step():
                    if out.finished and out.request_id in order:
                        finals[out.request_id] = out
        finally:
            for rid in set(order) - set(finals):
                self.engine.abort(rid)
        results = [
            GenerationResult(texts[i], ids[i], [None] * params.n)  # type: ignore[list-item]
            for i in range(len(ids))
        ]
        for rid, (i, j) in order.items():
            o = finals[rid]
            results[i].outputs[j] = CompletionOutput(j, o.text, o.token_ids, o.finish_reason)
        return results


def _choice(params: SamplingParams, j: int) -> SamplingParams:
    from dataclasses import replace

    seed = None if params.seed is None else params.seed + j
    return replace(params, n=1, seed=seed)


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and (not x or isinstance(x[0], int))
