"""The start-up warm-up (``mmserve.engine.warmup``) on the real default model, on CPU:
it runs every kind of step and leaves nothing behind."""

from __future__ import annotations

from mmserve import LLM, SamplingParams
from mmserve.engine.warmup import warm_up

GREEDY = SamplingParams(temperature=0, max_tokens=8)
PROMPT = "Answer in one word. Which city is the capital of France, the country in Europe?"


def test_warm_up_leaves_no_trace_and_outputs_unchanged(default_model_dir):
    llm = LLM(str(default_model_dir), max_num_seqs=3, max_num_batched_tokens=64)
    before = llm.generate(PROMPT, GREEDY)[0].token_ids
    report = warm_up(llm.engine)
    # rounds of 1, 2 and 3 prompts (greedy and sampled), then a prompt over the budget
    assert report.requests == 2 * (1 + 2 + 3) + 3
    assert report.steps > report.requests // 3  # several prompts share steps
    engine = llm.engine
    assert not engine.has_unfinished() and not engine.requests
    assert engine.blocks.num_used_blocks == 0
    stats = engine.stats()
    assert (stats.prompt_tokens_total, stats.generation_tokens_total) == (0, 0)
    assert (stats.prefix_cache_hit_tokens_total, stats.prefix_cache_query_tokens_total) == (0, 0)
    assert llm.generate(PROMPT, GREEDY)[0].token_ids == before
    # the cache was emptied: the prompt's full blocks, cached by the first run, are gone
    assert engine.blocks.prefix_queries > 16 and engine.blocks.prefix_hits == 0
