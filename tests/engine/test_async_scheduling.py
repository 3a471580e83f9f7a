"""Async scheduling on the real default model: a step launched before the last step's
tokens reach the host changes no output, stream or finish, leaks no block, and copes
with aborts, new arrivals, preemption and speculation.

On CPU there is nothing to overlap (a step launched ahead runs at once), so the engine
keeps it off there; these tests switch it on to run its bookkeeping, and compare every
request's deltas against the same requests with it off (the synchronous engine)."""

from __future__ import annotations

import collections

import pytest

from mmserve import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "1, 2, 3, 4,",
    "The best way to learn Python is",
    "Water boils at",
    "My favourite colour is",
    "import numpy as np\n",
    "Dear Sir or Madam,",
    "Q: What is 7 times 8?\nA:",
]


def _params(i: int) -> SamplingParams:
    """Greedy requests that end at different steps: by length (1 token up), at EOS, at a
    stop string; one with min_tokens (no overlap until it is past them)."""
    if i == 3:
        return SamplingParams(temperature=0, max_tokens=20, stop=[" 9"])
    if i == 5:
        return SamplingParams(temperature=0, max_tokens=18, min_tokens=4)
    return SamplingParams(temperature=0, max_tokens=(1, 2, 7, 24, 13, 40)[i % 6])


def _drive(llm: LLM, overlap: bool, params=_params, prompts=PROMPTS, hook=None):
    """Run the prompts on the engine directly -> ({id: [deltas]}, {id: final output},
    steps launched ahead, steps prelaunched). ``hook(engine, step_number, ids)`` runs
    before each step."""
    eng = llm.engine
    eng.async_scheduling = overlap
    before, pre = eng.ahead_steps, eng.prelaunched_steps
    ids = [eng.add_request(llm.tokenizer.encode(p), params(i)) for i, p in enumerate(prompts)]
    deltas: dict[str, list] = collections.defaultdict(list)
    finals = {}
    step = 0
    try:
        while eng.has_unfinished():
            if hook is not None:
                hook(eng, step, ids)
            step += 1
            for out in eng.step():
                deltas[out.request_id].append((out.new_token_ids, out.new_text))
                if out.finished:
                    finals[out.request_id] = out
    finally:
        eng.async_scheduling = False
    names = {r: i for i, r in enumerate(ids)} | {r: r for r in deltas if r not in ids}
    view = {names[r]: d for r, d in deltas.items()}
    done = {
        names[r]: (o.token_ids, o.text, o.finish_reason, o.stop_reason) for r, o in finals.items()
    }
    return view, done, eng.ahead_steps - before, eng.prelaunched_steps - pre


@pytest.fixture(scope="module")
def llm(default_model_dir):
    return LLM(str(default_model_dir), max_num_seqs=16)


def test_steps_launched_ahead_change_no_delta_and_leak_no_block(llm):
    sync = _drive(llm, False)
    ahead = _drive(llm, True)
    assert sync[2] == sync[3] == 0 and ahead[2] > 5  # it ran ahead, many times
    assert ahead[3] > 0  # and launched steps before the last one's outputs (prefills)
    assert ahead[0] == sync[0]  # every request's stream, delta for delta
    assert ahead[1] == sync[1]
    assert {f[2] for f in sync[1].values()} >= {"length", "stop"}
    assert llm.engine.blocks.num_used_blocks == 0
    assert llm.engine.launch.pending is None


def test_requests_queued_for_a_slot_while_steps_run_ahead(llm):
    """Three slots for ten requests: steps run ahead while every slot is taken; one that
    frees by length admits the next request at once, one freed by EOS or a stop string a
    step later. Every stream is the synchronous engine's."""
    sched = llm.engine.scheduler
    slots, sched.max_num_seqs = sched.max_num_seqs, 3
    try:
        sync = _drive(llm, False)
        ahead = _drive(llm, True)
    finally:
        sched.max_num_seqs = slots
    assert ahead[2] > 10
    assert ahead[0] == sync[0] and ahead[1] == sync[1]
    assert llm.engine.blocks.num_used_blocks == 0


def _admits_ahead_in_three_slots(llm, params, reason: str) -> None:
    """Ten requests in three slots, all ending for ``reason``: at least five join a step
    launched ahead, every stream is the synchronous engine's, delta for delta, and no
    block or launched step is left."""
    sched = llm.engine.scheduler
    slots, sched.max_num_seqs = sched.max_num_seqs, 3
    admitted = llm.engine.launch.ahead_admissions
    try:
        sync = _drive(llm, False, params)
        ahead = _drive(llm, True, params)
    finally:
        sched.max_num_seqs = slots
    assert {f[2] for f in sync[1].values()} == {reason}
    assert llm.engine.launch.ahead_admissions - admitted >= 5
    assert ahead[0] == sync[0] and ahead[1] == sync[1]
    assert llm.engine.blocks.num_used_blocks == 0 and llm.engine.launch.pending is None


def test_a_slot_freed_at_a_stop_admits_into_the_step_run_ahead(llm):
    """Requests that end at a stop token, each at its own step: the next request joins
    the step launched ahead (its whole prompt one chunk beside the decodes), a step later
    than the synchronous engine admits it."""
    free = _drive(llm, False, lambda i: SamplingParams(temperature=0, max_tokens=16))[1]

    def params(i):  # stop at (about) token 3..12 of the request's own greedy answer
        ids = free[i][0]
        return SamplingParams(
            temperature=0, max_tokens=16, stop_token_ids=[ids[min(3 + i, len(ids) - 1)]]
        )

    _admits_ahead_in_three_slots(llm, params, "stop")


def test_a_slot_freed_by_length_admits_into_the_step_run_ahead(llm):
    """Requests that end by length, each at its own step: the step launched ahead leaves
    out the row whose last token the running step brings and admits the next request
    into its slot, the same step the synchronous engine admits it in."""
    _admits_ahead_in_three_slots(
        llm,
        lambda i: SamplingParams(temperature=0, max_tokens=3 + (7 * i) % 11, ignore_eos=True),
        "length",
    )


def test_logprob_requests_run_synchronously_beside_sampled_and_greedy_ones(llm):
    def params(i):
        if i == 0:
            return SamplingParams(temperature=0.8, seed=7, max_tokens=12)
        if i == 1:
            return SamplingParams(temperature=0, max_tokens=12, logprobs=2)
        return SamplingParams(temperature=0, max_tokens=12 + i)

    sync = _drive(llm, False, params, PROMPTS[:4])
    ahead = _drive(llm, True, params, PROMPTS[:4])
    assert ahead[0] == sync[0] and ahead[1] == sync[1]
    assert ahead[2] > 0  # once the sampled and logprob requests are done, it overlaps
    assert ahead[3] >= 11  # until then each step launched before the last one's outputs
    assert llm.engine.blocks.num_used_blocks == 0


def test_abort_and_arrival_while_a_step_is_prelaunched(llm):
    """Sampled requests (seeded) with a presence penalty (the sampler needs the host's
    counts) do not overlap, so each step is launched once the last one's tokens are in,
    before its outputs: an abort then drops the request's row of that step, a request
    added then joins a step later. Streams with stop strings and without (whose text
    waits for the launch) equal the synchronous engine's."""
    seen = []

    def params(i):
        stop = [" the", "."] if i % 2 else []
        return SamplingParams(
            temperature=0.9, seed=11 + i, max_tokens=16 + 3 * i, stop=stop, presence_penalty=0.3
        )

    def hook(eng, step, ids):
        if step == 5:
            seen.append((type(eng.launch.pending).__name__, eng.abort(ids[2]).finish_reason))
            eng.add_request(
                llm.tokenizer.encode("The moon is"),
                SamplingParams(temperature=0.9, seed=5, max_tokens=9, presence_penalty=0.3),
                "late",
            )

    sync = _drive(llm, False, params, PROMPTS[:6], hook)
    ahead = _drive(llm, True, params, PROMPTS[:6], hook)
    assert seen == [("NoneType", "abort"), ("LaunchedStep", "abort")]
    assert ahead[0] == sync[0] and ahead[1] == sync[1]
    assert 2 not in ahead[1] and "late" in ahead[1]
    assert {f[2] for f in sync[1].values()} == {"length", "stop"}
    assert ahead[3] > 10
    assert llm.engine.blocks.num_used_blocks == 0
    assert llm.engine.launch.pending is None


def test_abort_and_arrival_while_a_step_runs_ahead(llm):
    """An abort between steps (the server's path) drops the request's row of the step
    already launched; a request added then joins at the next step. The others' outputs
    are the synchronous engine's."""
    seen = []

    def hook(eng, step, ids):
        if step == 4:
            seen.append((eng.launch.pending is not None, eng.abort(ids[3]).finish_reason))
            eng.add_request(
                llm.tokenizer.encode("The moon is"),
                SamplingParams(temperature=0, max_tokens=9),
                "late",
            )

    def run(overlap):
        return _drive(
            llm, overlap, lambda i: SamplingParams(temperature=0, max_tokens=30), PROMPTS[:6], hook
        )

    sync = run(False)
    ahead = run(True)
    # the abort came while a step was running ahead
    assert seen == [(False, "abort"), (True, "abort")]
    assert ahead[1] == sync[1] and 3 not in ahead[1] and "late" in ahead[1]
    assert ahead[0] == sync[0]
    assert llm.engine.blocks.num_used_blocks == 0


def test_sampled_requests_run_ahead_and_draw_what_the_synchronous_engine_draws(llm):
    """Seeded sampled requests (temperature, top-p, top-k; stop strings for some; one with
    min_tokens, which overlaps once past them: a step launched ahead counts the last
    step's token before the host has it) draw each token on the device when its step is
    launched, from their own generators: the same draws in the same order as the
    synchronous engine, through an abort while a step runs ahead and an arrival then."""
    seen = []

    def params(i):
        return SamplingParams(
            temperature=(0.7, 1.0, 0.9)[i % 3],
            seed=21 + i,
            top_p=0.9 if i % 2 else 1.0,
            top_k=40 if i % 3 == 1 else 0,
            stop=[" the"] if i % 3 == 2 else [],
            min_tokens=6 if i == 4 else 0,
            max_tokens=14 + 4 * i,
        )

    def hook(eng, step, ids):
        if step == 10:  # past the min_tokens request's first 6 tokens
            seen.append((type(eng.launch.pending).__name__, eng.abort(ids[1]).finish_reason))
            eng.add_request(
                llm.tokenizer.encode("The moon is"),
                SamplingParams(temperature=0.8, seed=3, max_tokens=9),
                "late",
            )

    sync = _drive(llm, False, params, PROMPTS[:6], hook)
    ahead = _drive(llm, True, params, PROMPTS[:6], hook)
    assert seen == [("NoneType", "abort"), ("DecodeOnDevice", "abort")]
    assert ahead[1] == sync[1] and ahead[0] == sync[0]
    assert 1 not in ahead[1] and "late" in ahead[1] and len(ahead[1]) == 6
    assert ahead[2] >= 15  # most steps once the min_tokens request is past them
    assert llm.engine.blocks.num_used_blocks == 0
    assert llm.engine.launch.pending is None


def test_late_request_output_equals_its_output_alone(llm):
    alone = llm.generate("The moon is", SamplingParams(temperature=0, max_tokens=9))[0]
    eng = llm.engine
    eng.async_scheduling = True
    try:
        eng.add_request(
            llm.tokenizer.encode(PROMPTS[0]), SamplingParams(temperature=0, max_tokens=30), "first"
        )
        for _ in range(5):
            eng.step()
        assert eng.launch.pending is not None
        eng.add_request(
            llm.tokenizer.encode("The moon is"), SamplingParams(temperature=0, max_tokens=9), "late"
        )
        finals = {}
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    finals[out.request_id] = out
    finally:
        eng.async_scheduling = False
    assert finals["late"].token_ids == alone.token_ids
    assert eng.blocks.num_used_blocks == 0


def test_preemption_under_async_scheduling_keeps_outputs(default_model_dir):
    small = LLM(str(default_model_dir), num_kv_blocks=14, enable_prefix_caching=False)
    params = lambda i: SamplingParams(temperature=0, max_tokens=24)  # noqa: E731
    sync = _drive(small, False, params, PROMPTS[:8])
    preempted = small.engine.scheduler.num_preemptions
    ahead = _drive(small, True, params, PROMPTS[:8])
    assert preempted > 0 and small.engine.scheduler.num_preemptions > preempted
    assert ahead[1] == sync[1] and ahead[2] > 0
    assert small.engine.blocks.num_used_blocks == 0


def test_speculation_with_async_scheduling_is_exact(default_model_dir):
    """Steps the controller would take plain whatever the newest tokens are (pauses,
    quiet steps, a veto's hold) run ahead; the rest are proposed as before. Greedy
    outputs equal plain decode's."""
    spec = LLM(
        str(default_model_dir),
        max_num_seqs=16,
        speculative_config={"method": "ngram", "num_speculative_tokens": "auto"},
    )
    params = lambda i: SamplingParams(temperature=0, max_tokens=40)  # noqa: E731
    # prompts whose continuations repeat what they hold, so the n-gram drafter finds
    # matches (the rest are the module's)
    prompts = [
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
        "A B C D E F G H I J K L M N",
        "Monday, Tuesday, Wednesday,",
        "for i in range(10):\n    print(i)\n" * 2 + "for i in range(10):\n",
        *PROMPTS[:4],
    ]
    spec.engine.set_speculation(False)
    plain = _drive(spec, False, params, prompts)
    spec.engine.set_speculation(True)
    ahead = _drive(spec, True, params, prompts)
    assert ahead[1] == plain[1]
    assert ahead[2] > 0 and ahead[3] > 0  # steps after a verify step are prelaunched
    totals = spec.engine.spec.controller.totals()
    assert totals.num_draft_tokens > 0  # and it still speculated
    assert spec.engine.blocks.num_used_blocks == 0
