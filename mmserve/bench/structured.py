"""``mmserve bench structured``: constrained against free decoding, in the same run.

For each batch size the same chat prompts decode ``max_tokens`` tokens twice on one
engine, alternately (``repeats`` pairs): free (``ignore_eos``, so every request runs the
full length) and constrained by a JSON schema that cannot complete within the length (an
array of at least 10,000 records: every step is masked, none ends early), so both sides take
the same steps. Decode tok/s counts the tokens made after every request's first token
(prefill excluded); the mask cost is the host time the sampler spends filling and applying
bitmasks a step. Every constrained token is checked against the grammar (none refused).
Writes ``structured.json`` into ``out_dir`` and prints a table.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from mmserve.config import EngineConfig
from mmserve.engine import sampler as sampler_module
from mmserve.engine.engine import LLMEngine
from mmserve.engine.factory import create_engine
from mmserve.engine.sampler import Sampler
from mmserve.sampling_params import SamplingParams
from mmserve.structured import StructuredOutput, grammar

TARGET = 0.9  # issue 51: constrained decode >= 0.9x free decode
RECORD = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 16},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "name", "tags", "score", "ok"],
    "additionalProperties": False,
}
SCHEMA = {
    "type": "object",
    "properties": {"records": {"type": "array", "items": RECORD, "minItems": 10_000}},
    "required": ["records"],
    "additionalProperties": False,
}


class _MaskTimer:
    """Host seconds in ``Sampler._apply_grammars`` (fill + copy + masked fill launch), and
    of those, in the grammar library's fill alone (the rest is torch's host work)."""

    def __init__(self, sampler: Sampler) -> None:
        self.seconds, self.calls, self.fill_seconds = 0.0, 0, 0.0
        inner = sampler._apply_grammars
        fill = sampler_module.fill_many

        def timed(*args: Any) -> None:
            t = time.perf_counter()
            inner(*args)
            self.seconds += time.perf_counter() - t
            self.calls += 1

        def timed_fill(*args: Any) -> None:
            t = time.perf_counter()
            fill(*args)
            self.fill_seconds += time.perf_counter() - t

        sampler._apply_grammars = timed  # type: ignore[method-assign,assignment]
        sampler_module.fill_many = timed_fill  # type: ignore[assignment]


def _prompts(engine: LLMEngine, n: int) -> list[list[int]]:
    tok = engine.tokenizer
    return [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": f"List customer records #{i} as JSON."}]
            )
        )
        for i in range(n)
    ]


def _sync(engine: LLMEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def _decode(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, timer: _MaskTimer
) -> dict[str, float]:
    """One batch to the end -> decode tok/s, steps, mask host us a step."""
    ids = [engine.add_request(p, params) for p in prompts]
    grammars = [engine.requests[i].sampling.grammar for i in ids]
    made = {i: 0 for i in ids}
    start = None
    decoded = steps = 0
    mask_s0 = mask_n0 = fill_s0 = 0.0
    while engine.has_unfinished():
        outs = engine.step()
        if start is not None:
            steps += 1
            decoded += sum(len(o.new_token_ids) for o in outs)
        for o in outs:
            made[o.request_id] += len(o.new_token_ids)
        if start is None and all(made.values()):
            _sync(engine)
            start = time.perf_counter()
            mask_s0, mask_n0, fill_s0 = timer.seconds, timer.calls, timer.fill_seconds
    _sync(engine)
    assert start is not None
    seconds = time.perf_counter() - start
    calls = timer.calls - mask_n0
    refused = sum(g.failed for g in grammars if g is not None)
    return {
        "tok_s": decoded / seconds,
        "steps": steps,
        "seconds": seconds,
        "mask_us_per_step": 1e6 * (timer.seconds - mask_s0) / max(steps, 1),
        "fill_us_per_step": 1e6 * (timer.fill_seconds - fill_s0) / max(steps, 1),
        "mask_calls": calls,
        "refused": refused,
    }


def _measure(
    engine: LLMEngine,
    prompts: list[list[int]],
    free: SamplingParams,
    constrained: SamplingParams,
    timer: _MaskTimer,
    repeats: int,
) -> dict[str, Any]:
    """Free and constrained decodes of ``prompts``, alternated ``repeats`` times -> a row."""
    runs: dict[str, list[dict[str, float]]] = {"free": [], "constrained": []}
    for _ in range(repeats):
        runs["free"].append(_decode(engine, prompts, free, timer))
        runs["constrained"].append(_decode(engine, prompts, constrained, timer))
    med = {k: statistics.median(r["tok_s"] for r in v) for k, v in runs.items()}
    return {
        "free_tok_s": med["free"],
        "constrained_tok_s": med["constrained"],
        "ratio": med["constrained"] / med["free"],
        "mask_us_per_step": statistics.median(r["mask_us_per_step"] for r in runs["constrained"]),
        "fill_us_per_step": statistics.median(r["fill_us_per_step"] for r in runs["constrained"]),
        "steps": runs["constrained"][0]["steps"],
        "refused_tokens": sum(r["refused"] for r in runs["constrained"]),
        "runs": runs,
    }


def run_structured_bench(
    model: str | None = None,
    device: str = "auto",
    batches: tuple[int, ...] = (1, 32),
    max_tokens: int = 128,
    repeats: int = 3,
    out_dir: str = "bench/out",
    fill_threads: tuple[int, ...] = (0,),
) -> dict[str, Any]:
    """Free against constrained decode at each batch; each ``fill_threads`` setting (the
    grammar fill's pool, ``EngineConfig.grammar_fill_threads``) gets its own row."""
    config = EngineConfig(
        model=model, device=device, max_num_seqs=max(batches), max_model_len=max_tokens + 128
    )
    engine = create_engine(config)
    timer = _MaskTimer(engine.sampler)
    free = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    constrained = SamplingParams(
        temperature=0, max_tokens=max_tokens, structured=StructuredOutput.json_schema(SCHEMA)
    )
    engine.grammars.compile(constrained.structured)  # type: ignore[arg-type]
    rows: dict[str, Any] = {}
    for b in batches:
        prompts = _prompts(engine, b)
        _decode(engine, prompts, free, timer)  # warm-up: graphs, allocator, matcher pools
        for t in fill_threads:
            engine.sampler.fill_threads = t
            try:
                _decode(engine, prompts, constrained, timer)
                key = str(b) if t == fill_threads[0] else f"{b} fill {t}"
                rows[key] = _measure(engine, prompts, free, constrained, timer, repeats)
            finally:
                engine.sampler.fill_threads = config.grammar_fill_threads
            rows[key]["fill_threads"] = grammar.threads_for(b, t)
    result = {
        "machine": {
            "device": str(engine.device),
            "host": platform.node(),
            "gpu": torch.cuda.get_device_name(engine.device)
            if engine.device.type == "cuda"
            else None,
            "torch": torch.__version__,
        },
        "model": model or "default",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "async_scheduling": engine.async_scheduling,
        "target": TARGET,
        "batches": rows,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "structured.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    return result


def table(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"{m['gpu'] or m['device']}  model {result['model']}  {result['max_tokens']} "
        f"tokens  median of {result['repeats']}  target {result['target']}x",
        "     batch   free tok/s  constrained tok/s  ratio  mask us/step  fill us/step  refused",
    ]
    for b, r in result["batches"].items():
        lines.append(
            f"{b:>10}  {r['free_tok_s']:>11,.1f}  {r['constrained_tok_s']:>17,.1f}  "
            f"{r['ratio']:5.2f}  {r['mask_us_per_step']:>12,.0f}  "
            f"{r.get('fill_us_per_step', float('nan')):>12,.0f}  "
            f"{r['refused_tokens']:>7}"
        )
    return "\n".join(lines)
