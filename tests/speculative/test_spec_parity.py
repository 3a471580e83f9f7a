"""Greedy parity of speculative decoding with plain decode, on the real default model.

A battery of prompts (copy-heavy edits, code, prose, lists) runs with each drafter at
batch sizes 1, 4 and 16; every output's token ids must equal plain decode's. Plain
decode is batch-invariant (tests/engine), so one plain run at batch 16 is the reference
for all three.
"""

import random

import pytest

from mmserve import LLM, SamplingParams
from mmserve.bench.spec_workloads import workload
from mmserve.speculative.ngram_build import build_table

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)


def battery() -> list[str]:
    rng = random.Random(0)
    words = (
        "alpha beta gamma delta river stone cloud paper seven orange window garden "
        "silver quiet bridge engine market winter copper signal"
    ).split()
    prompts = []
    for i in range(40):  # copy-heavy: the continuation repeats the prompt
        line = " ".join(rng.choice(words) for _ in range(8))
        prompts.append(f"Copy the line exactly.\nLine: {line}\nCopy: {line[: 5 + i % 20]}")
    for i in range(20):
        prompts.append(f"def f{i}(x):\n    return x * {i} + f{i}(x - 1)\n\ndef g{i}(x):\n")
    for i in range(20):
        prompts.append(f"Item {i}: {', '.join(str(i + j) for j in range(6))},")
    for i in range(20):
        prompts.append(f"Story {i}: The {rng.choice(words)} {rng.choice(words)} was")
    return prompts


PROMPTS = battery()
# (batch size, stride through PROMPTS): every stride keeps all four kinds of prompt in
# proportion. On the CPU a prompt's prefill is most of its cost, so the prompts run, not
# the batch shapes, set this file's time; batch 16 still refills its slots 3 times over.
RUNS = ((1, 8), (4, 4), (16, 2))
REFERENCE_STRIDE = 2  # every stride in RUNS is a multiple of it


@pytest.fixture(scope="module")
def reference(default_model_dir):
    """Plain decode's ids for PROMPTS[::REFERENCE_STRIDE], in that order."""
    llm = LLM(str(default_model_dir), max_num_seqs=16)
    return [r.token_ids for r in llm.generate(PROMPTS[::REFERENCE_STRIDE], GREEDY)]


@pytest.fixture(scope="module")
def table_path(tmp_path_factory, default_model_dir):
    from mmserve.models.tokenizer import Tokenizer

    tok = Tokenizer(default_model_dir)
    corpus = [tok.encode(p) for p in PROMPTS] * 2
    path = tmp_path_factory.mktemp("ngram") / "table.bin"
    build_table(corpus, path, n=2, max_continuation=6, min_count=2)
    return str(path)


def spec_config(method, table_path):
    config = {"method": method, "num_speculative_tokens": 4}
    if method == "ngram_table":
        config["table_path"] = table_path
    if method == "self":
        config["self_draft_layers"] = 8
    if method == "draft_model":
        config["draft_model"] = "smollm2-135m-instruct"
    return config


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "ngram_table", "self", "draft_model"])
def test_greedy_parity_at_batch_1_4_16(default_model_dir, reference, table_path, method):
    """Every second prompt at batch 16, every fourth at 4, every eighth at 1 (each subset
    spans all four kinds of prompt): a batch shape is checked by any prompts that fill it,
    and each prompt run costs a prefill."""
    config = spec_config(method, table_path)
    for batch, stride in RUNS:
        llm = LLM(str(default_model_dir), max_num_seqs=batch, speculative_config=config)
        got = [r.token_ids for r in llm.generate(PROMPTS[::stride], GREEDY)]
        want = reference[:: stride // REFERENCE_STRIDE]
        mismatched = [i * stride for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]
        assert not mismatched, (method, batch, mismatched[:5])
        stats = llm.engine.stats()
        assert stats.spec_draft_tokens_total > 0, "the drafter never proposed anything"
        assert llm.engine.blocks.num_used_blocks == 0


def test_auto_k_parity_mixed_with_plain_requests_and_preemption(default_model_dir):
    """Speculative and plain (logprobs) requests in one batch, a tiny KV pool forcing
    preemption, prefix caching on: still token-for-token equal to plain decode."""
    greedy = SamplingParams(temperature=0, max_tokens=24)
    prompts = PROMPTS[:24]
    reference = [r.token_ids for r in LLM(str(default_model_dir)).generate(prompts, greedy)]
    llm = LLM(
        str(default_model_dir),
        max_num_seqs=8,
        num_kv_blocks=7,
        speculative_config={"method": "ngram", "num_speculative_tokens": "auto"},
    )
    with_logprobs = SamplingParams(temperature=0, max_tokens=24, logprobs=2)
    eng = llm.engine
    ids = {}
    for i, prompt in enumerate(prompts):
        params = with_logprobs if i % 3 == 0 else greedy  # logprobs requests never draft
        ids[eng.add_request(llm.tokenizer.encode(prompt, add_special_tokens=True), params)] = i
    outs = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                outs[ids[o.request_id]] = o.token_ids
    assert [outs[i] for i in range(24)] == reference
    assert eng.scheduler.num_preemptions > 0
    assert eng.stats().spec_draft_tokens_total > 0
    assert eng.blocks.num_used_blocks == 0


def test_speculation_switched_off_is_plain_decode_on_the_same_engine(default_model_dir):
    """``set_speculation(False)`` (the spec bench's plain side): no drafts, the same ids;
    back on, drafting resumes; switching with a request in flight, or on an engine built
    without a speculative_config, is refused."""
    prompts = PROMPTS[:6]
    greedy = SamplingParams(temperature=0, max_tokens=16)
    llm = LLM(
        str(default_model_dir),
        max_num_seqs=4,
        speculative_config={"method": "ngram", "num_speculative_tokens": 4},
    )
    eng = llm.engine
    on = [r.token_ids for r in llm.generate(prompts, greedy)]
    drafted = eng.stats().spec_draft_tokens_total
    assert drafted > 0
    eng.set_speculation(False)
    assert [r.token_ids for r in llm.generate(prompts, greedy)] == on
    assert eng.stats().spec_draft_tokens_total == drafted  # counters kept, nothing drafted
    eng.set_speculation(True)
    assert [r.token_ids for r in llm.generate(prompts, greedy)] == on
    assert eng.stats().spec_draft_tokens_total > drafted
    eng.add_request(llm.tokenizer.encode(prompts[0], add_special_tokens=True), greedy)
    with pytest.raises(RuntimeError, match="in flight"):
        eng.set_speculation(False)
    while eng.has_unfinished():
        eng.step()
    with pytest.raises(ValueError, match="speculative_config"):
        LLM(str(default_model_dir)).engine.set_speculation(True)


def test_a_drafts_first_index_is_kept_out_of_the_measured_step_cost(default_model_dir, monkeypatch):
    """The drafter prepares (indexes) a request's context once, before its first draft,
    and that one-off time is not charged to the step's cost: made 1 s slower here, it
    shows in no verify step the controller measured. A request that never drafts is
    never indexed."""
    import time

    llm = LLM(
        str(default_model_dir),
        max_num_seqs=2,
        speculative_config={"method": "ngram", "num_speculative_tokens": "auto"},
    )
    spec = llm.engine.speculator
    drafter, calls = spec.drafter, []
    real = drafter.prepare

    def slow_prepare(request):
        calls.append(request.request_id)
        time.sleep(1.0)
        real(request)

    monkeypatch.setattr(drafter, "prepare", slow_prepare)
    greedy = SamplingParams(temperature=0, max_tokens=24)
    llm.chat(workload("edit", 1), greedy)  # copies its prompt
    assert llm.engine.stats().spec_draft_tokens_total > 0
    assert len(calls) == 1  # once, for the request that drafted
    verify = spec.controller._verify_cost._points.values()
    assert verify and max(p.seconds for p in verify) < 1.0
    plain = SamplingParams(temperature=0, max_tokens=4, logprobs=1)  # never drafts
    llm.generate(["Hello"], plain)
    assert len(calls) == 1


def test_steps_nobody_can_probe_skip_the_pass_and_change_nothing(default_model_dir):
    """Verify steps priced far above plain ones: after each request's first decode step
    nobody can probe, so the speculator takes the steps as quiet ones (no pass over the
    requests, one cost sample in 8) while the running requests stay the same; a new
    request ends that (it probes at once). Outputs equal plain decode's."""
    prompts = PROMPTS[:4]
    greedy = SamplingParams(temperature=0, max_tokens=24)
    llm = LLM(
        str(default_model_dir),
        max_num_seqs=4,
        speculative_config={"method": "ngram", "num_speculative_tokens": "auto"},
    )
    spec = llm.engine.speculator
    for rows in range(1, 80):  # a verify step priced at 100 plain steps: no draft can pay
        for _ in range(2):
            spec.controller.record_step(rows, 0.01, graph=False)
            spec.controller.record_step(rows, 1.0, verify=True, graph=False)
    plain = [r.token_ids for r in LLM(str(default_model_dir)).generate(prompts, greedy)]
    assert [r.token_ids for r in llm.generate(prompts, greedy)] == plain
    assert llm.engine.stats().spec_draft_tokens_total == 0
    assert spec._quiet_steps >= 24 - 4  # all but a few of the decode steps


def test_probes_ask_for_longer_matches_and_the_queue_reaches_the_controller(
    default_model_dir, monkeypatch
):
    """The engine tells the controller how many requests wait for a slot (6 prompts, 2
    slots: 4, then fewer), and a probe's draft request asks for a match of 2 tokens or
    more while a drafting request's asks for 1; a request the drafter said has no such
    match (``has_match``) does not probe in that step. Outputs equal plain decode's."""
    from mmserve.speculative.speculator import PROBE_MIN_MATCH

    prompts = PROMPTS[:3] + PROMPTS[40:43]  # copy-heavy and code
    greedy = SamplingParams(temperature=0, max_tokens=16)
    llm = LLM(
        str(default_model_dir),
        max_num_seqs=2,
        speculative_config={"method": "ngram", "num_speculative_tokens": "auto"},
    )
    spec = llm.engine.speculator
    ctrl, seen, waits = spec.controller, [], []
    no_match: set[tuple[int, str]] = set()  # (choose call, request) the drafter said no to
    real_propose, real_choose = spec.drafter.propose, ctrl.choose

    def propose(batch):
        seen.extend(
            (r.min_match, ctrl.probing(r.request_id), len(waits), r.request_id) for r in batch
        )
        return real_propose(batch)

    def choose(ids, other=0, has_match=None):
        waits.append(ctrl.waiting)
        if has_match is None:
            return real_choose(ids, other, None)

        def asked(request_id):
            found = has_match(request_id)
            if not found:
                no_match.add((len(waits), request_id))
            return found

        return real_choose(ids, other, asked)

    monkeypatch.setattr(spec.drafter, "propose", propose)
    monkeypatch.setattr(ctrl, "choose", choose)
    plain = [r.token_ids for r in LLM(str(default_model_dir)).generate(prompts, greedy)]
    assert [r.token_ids for r in llm.generate(prompts, greedy)] == plain
    assert {m for m, probe, _, _ in seen if probe} == {PROBE_MIN_MATCH}
    assert {m for m, probe, _, _ in seen if not probe} == {1}
    assert not no_match & {(step, r) for _, probe, step, r in seen if probe}
    assert max(waits) == 4 and min(waits) == 0
