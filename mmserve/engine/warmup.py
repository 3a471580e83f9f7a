"""Start-up warm-up: every step shape a request can reach runs once before serving.

On CUDA a kernel is compiled (Triton) or has its algorithm picked (cuBLAS) the first time
it meets a new specialisation: dtype, block-size constants, and integer arguments that
are 1 or divisible by 16. Graph capture runs decode and verify steps at the captured
batch sizes and batch-1 prefill chunks; everything else runs eagerly and compiles on
first use: steps that prefill several prompts' chunks beside running decodes, prefill
lengths that are not graph lengths, a full-budget chunk, and the sampler's paths (draws
with temperature, top-k, top-p, min-p, penalties, logprobs, a grammar's bitmask).
Unwarmed, the first requests of a fresh server pay those compiles: seconds of TTFT.

``warm_up`` drives synthetic requests through the engine itself, so it reaches exactly
the kernels real requests reach: rounds of 1, 2, 3, 16 and 17 prompts at once (sequence
counts of 1, multiples of 16 and neither) whose lengths are likewise 1, multiples of 16
and neither, greedy and sampled, decoding a few tokens each; then one prompt longer than
a step's token budget (a full chunk, then the rest beside decodes; capped by the context,
so at most a context-long prompt where the budget is larger). Speculation is
switched off meanwhile: its cost model must never record a step that paid a compile;
for the same reason the audio policy's step-cost fit (admission control) is dropped after.

Afterwards nothing of it remains: every request finished and its blocks freed, the
prefix cache emptied, the engine's counters back to zero.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, NamedTuple

import torch

from mmserve.engine.engine import LLMEngine
from mmserve.sampling_params import SamplingParams
from mmserve.structured.bitmask import apply_bitmask, bitmask_words

log = logging.getLogger("mmserve")

ROUND_SIZES = (1, 2, 3, 16, 17)  # prompts added at once
PROMPT_LENGTHS = (1, 16, 17, 33, 64, 100, 5, 48)  # cycled over a round's prompts
NEW_TOKENS = 3


class WarmupReport(NamedTuple):
    seconds: float
    requests: int
    steps: int


def warm_up(engine: LLMEngine, seed: int = 0) -> WarmupReport:
    """Run the warm-up (module docstring); the engine must have no request in flight."""
    assert not engine.has_unfinished(), "warm up an idle engine"
    start = time.perf_counter()
    spec_on = engine.spec is not None
    if spec_on:
        engine.set_speculation(False)
    rng = random.Random(seed)
    requests = steps = 0
    try:
        for i, n in enumerate(r for r in ROUND_SIZES if r <= engine.scheduler.max_num_seqs):
            for sampled in (False, True):
                prompts = [
                    _prompt(engine, rng, PROMPT_LENGTHS[(i + j) % len(PROMPT_LENGTHS)])
                    for j in range(n)
                ]
                params = [_params(sampled, j) for j in range(n)]
                steps += _run(engine, prompts, params)
                requests += n
        long = _prompt(engine, rng, engine.scheduler.budget + 17)
        short = [_prompt(engine, rng, 20) for _ in range(2)]
        steps += _run(engine, [*short, long], [_params(False, 0)] * 3)
        requests += 3
    finally:
        if spec_on:
            engine.set_speculation(True)
    _warm_bitmask(engine)
    _forget(engine)
    report = WarmupReport(time.perf_counter() - start, requests, steps)
    log.info(
        "warmed up %d requests in %d steps in %.2fs", report.requests, report.steps, report.seconds
    )
    return report


def _warm_bitmask(engine: LLMEngine) -> None:
    """The grammar mask's kernel, one specialisation for the vocabulary: compiled here,
    not by the first constrained request (the synthetic requests carry no grammar: the
    grammar compiler may still be loading in the background)."""
    if engine.device.type != "cuda":
        return
    vocab = engine.model.vocab_size
    logits = torch.zeros(2, vocab, device=engine.device)
    full = torch.full((2, bitmask_words(vocab)), -1, dtype=torch.int32, device=engine.device)
    apply_bitmask(logits, full)


def _prompt(engine: LLMEngine, rng: random.Random, length: int) -> list[int]:
    """Random ids (none a prompt of a real request shares a cached block with), leaving
    room for the new tokens in the context."""
    length = max(1, min(length, engine.max_model_len - NEW_TOKENS - 1))
    return [rng.randrange(engine.model.vocab_size) for _ in range(length)]


def _params(sampled: bool, j: int) -> SamplingParams:
    """Greedy, or one of the sampler's paths (each with its own seed: the warm-up draws
    nothing from a generator a real request uses)."""
    if not sampled:
        return SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    variants: tuple[dict[str, Any], ...] = (
        dict(top_p=0.9, top_k=50),
        dict(min_p=0.05),
        dict(presence_penalty=0.5, frequency_penalty=0.3),
        dict(logprobs=2),
        dict(),
    )
    return SamplingParams(
        temperature=0.8,
        max_tokens=NEW_TOKENS,
        ignore_eos=True,
        seed=j,
        **variants[j % len(variants)],
    )


def _run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> int:
    """Add the prompts at once and step until all are done; the steps taken."""
    for ids, p in zip(prompts, params, strict=True):
        engine.add_request(ids, p)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps


def _forget(engine: LLMEngine) -> None:
    """Leave no trace: cached blocks dropped, counters zeroed."""
    blocks = engine.blocks
    assert blocks.num_used_blocks == 0, "a warm-up request kept its blocks"
    blocks.reset_prefix_cache()
    blocks.prefix_hits = blocks.prefix_queries = 0
    engine.scheduler.num_preemptions = engine.scheduler.prompt_steps = 0
    engine.steps_total = engine.step_seqs_total = 0
    engine.prompt_tokens_total = engine.generation_tokens_total = 0
    engine.launch.ahead_steps = engine.launch.prelaunched_steps = 0
    engine.scheduler.policy.forget_costs()
