"""The grammar layer on the default model's tokenizer: compile errors carry the library's
reason, compiled grammars are cached, a mask filled ahead of drafts equals a fresh matcher
advanced by them (the rollback the verifier relies on), and the bitmask on logits equals a
per-token reference."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mmserve.errors import InvalidRequestError
from mmserve.models.tokenizer import Tokenizer
from mmserve.sampling_params import SamplingParams
from mmserve.structured import StructuredOutput
from mmserve.structured import grammar as grammar_module
from mmserve.structured.bitmask import apply_bitmask, bitmask_words
from mmserve.structured.grammar import (
    GrammarCompiler,
    GrammarLoader,
    fill_many,
)

VOCAB = 49152
SCHEMA = {
    "type": "object",
    "properties": {
        "user": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["id", "tags"],
        },
        "kind": {"enum": ["a", "b"]},
        "score": {"type": "number"},
    },
    "required": ["user", "kind", "score"],
}
DOC = '{"user": {"id": 7, "tags": ["x", "yz"]}, "kind": "b", "score": -1.5}'


@pytest.fixture(scope="module")
def tok(default_model_dir) -> Tokenizer:
    return Tokenizer(default_model_dir)


@pytest.fixture(scope="module")
def grammars(tok) -> GrammarCompiler:
    return GrammarCompiler(tok, VOCAB)


def _allowed(mask: torch.Tensor, row: int) -> set[int]:
    """The row's allowed ids (``apply_bitmask`` is checked against a per-bit reference
    below)."""
    masked = apply_bitmask(torch.zeros(1, VOCAB), mask[row : row + 1])
    return set(torch.isfinite(masked[0]).nonzero().flatten().tolist())


def test_constraints_are_plain_data_and_validated():
    assert StructuredOutput.json_schema(SCHEMA) == StructuredOutput("json", json.dumps(SCHEMA))
    for bad in (
        ("xml", "x"),
        ("json", "[1]"),
        ("json", "{"),
        ("choice", "[]"),
        ("choice", '["a", 1]'),
        ("regex", ""),
    ):
        with pytest.raises(ValueError):
            StructuredOutput(*bad)
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(structured=StructuredOutput("json_object"), ignore_eos=True)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={5: 101.0})


def test_loader_builds_once_and_get_waits_for_a_preload_under_way():
    import threading

    started, release, built = threading.Event(), threading.Event(), []

    def build():
        started.set()
        release.wait(30)
        built.append(object())
        return built[-1]

    loader = GrammarLoader(build)  # type: ignore[arg-type]
    loader.start()
    assert started.wait(30) and not loader.ready
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(loader.get()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # get() waits for the build under way instead of a second one
    release.set()
    waiter.join(30)
    assert loader.ready and got == built and len(built) == 1 and loader.get() is built[0]
    broken = GrammarLoader(lambda: 1 / 0)  # type: ignore[arg-type,return-value]
    broken._preload()  # logged, not raised: the first constrained request reports it
    with pytest.raises(ZeroDivisionError):
        broken.get()


def test_exit_waits_for_a_preload_under_way():
    """A process that exits while the compiler is being built waits for the build: cut off
    inside xgrammar's native code, the preload thread would abort the process."""
    child = textwrap.dedent(
        """
        import time
        from mmserve.structured.grammar import GrammarLoader

        def build():
            time.sleep(0.5)
            print("built", flush=True)

        GrammarLoader(build).start()
        """
    )
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", child], cwd=repo, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout == "built\n", done.stdout + done.stderr


def test_invalid_constraints_say_why(grammars):
    with pytest.raises(InvalidRequestError, match="Unsupported type"):
        grammars.compile(StructuredOutput("json", '{"type": "nonsense"}'))
    with pytest.raises(InvalidRequestError, match="parenthesis"):
        grammars.compile(StructuredOutput("regex", "(ab"))
    with pytest.raises(InvalidRequestError, match="grammar"):
        grammars.compile(StructuredOutput("grammar", "root ::= undefined_rule"))


def test_compiled_grammars_are_cached_by_constraint(grammars):
    before = grammars.compiles
    spec = StructuredOutput.json_schema(SCHEMA)
    a = grammars.compile(spec)
    assert grammars.compile(StructuredOutput.json_schema(SCHEMA)) is a
    assert grammars.compiles == before + 1


def test_document_accepted_and_only_eos_after_it(grammars, tok):
    state = grammars.state(StructuredOutput.json_schema(SCHEMA))
    mask = torch.empty(1, bitmask_words(VOCAB), dtype=torch.int32)
    for t in tok.encode(DOC):
        state.fill(mask, 0)
        assert t in _allowed(mask, 0)
        assert state.accept(t)
    assert state.completed and not state.terminated
    state.fill(mask, 0)
    assert _allowed(mask, 0) == set(tok.eos_token_ids)


def test_mask_ahead_of_drafts_equals_a_matcher_advanced_by_them(grammars, tok):
    """``fill(ahead=drafts)`` rolls the drafts back: the state is unchanged afterwards, and
    the mask is that of a fresh matcher that accepted them (what a verify row needs)."""
    spec = StructuredOutput.json_schema(SCHEMA)
    ids = tok.encode(DOC)
    state = grammars.state(spec)
    mask = torch.empty(2, bitmask_words(VOCAB), dtype=torch.int32)
    for i in range(0, len(ids) - 3, 3):
        drafts = ids[i : i + 3]
        ref = grammars.state(spec)
        for t in ids[:i] + drafts:
            assert ref.accept(t)
        state.fill(mask, 0, drafts)
        ref.fill(mask, 1)
        assert torch.equal(mask[0], mask[1])
        assert state.valid_prefix(drafts + [tok.eos_token_id]) == 3  # EOS is refused mid-doc
        for t in drafts:
            assert state.accept(t)


def test_choice_and_regex(grammars, tok):
    state = grammars.state(StructuredOutput.choices(["yes", "no"]))
    mask = torch.empty(1, bitmask_words(VOCAB), dtype=torch.int32)
    state.fill(mask, 0)
    firsts = {tok.decode([t]) for t in _allowed(mask, 0)}
    assert firsts and all("yes".startswith(f) or "no".startswith(f) for f in firsts)
    assert state.valid_prefix(tok.encode("maybe")) == 0
    digits = grammars.state(StructuredOutput("regex", r"\d{3}"))
    assert digits.valid_prefix(tok.encode("123")) == len(tok.encode("123"))
    assert digits.valid_prefix(tok.encode("12a")) < len(tok.encode("12a"))


def test_apply_bitmask_equals_a_per_token_reference():
    g = torch.Generator().manual_seed(0)
    vocab = 1000
    logits = torch.randn(5, vocab, generator=g)
    words = bitmask_words(vocab)
    mask = torch.randint(-(2**31), 2**31 - 1, (5, words), generator=g, dtype=torch.int64)
    mask = mask.to(torch.int32)
    out = apply_bitmask(logits.clone(), mask)
    for r in range(5):
        for t in range(vocab):
            on = (int(mask[r, t // 32]) >> (t % 32)) & 1
            assert out[r, t].item() == (logits[r, t].item() if on else float("-inf"))


@pytest.mark.parametrize(
    "threads, serial_rows, pool",
    [(0, 64, 1), (0, 2, 2), (1, 64, 1), (1, 2, 1), (2, 64, 2), (3, 64, 3)],
)
def test_batched_fill_equals_one_by_one(grammars, tok, threads, serial_rows, pool, monkeypatch):
    """Whichever path fills the 3 rows (automatic: one thread below ``serial_rows``, else
    the automatic pool, made 2 here; n: a pool of n, 1 filling on this thread), the masks
    equal filling each state alone; the pool used is the one asked for."""
    monkeypatch.setattr(grammar_module, "SERIAL_ROWS", serial_rows)
    monkeypatch.setattr(grammar_module, "fill_threads", lambda: 2)
    used: list[int] = []
    real_pool = grammar_module._pool
    monkeypatch.setattr(grammar_module, "_pool", lambda n: used.append(n) or real_pool(n))
    specs = [
        StructuredOutput.json_schema(SCHEMA),
        StructuredOutput("json_object"),
        StructuredOutput("regex", r"\d{3}"),
    ]
    states = [grammars.state(s) for s in specs]
    for state, text in zip(states, ['{"user": {', '{"a', "1"], strict=True):
        for t in tok.encode(text):
            assert state.accept(t)
    words = bitmask_words(VOCAB)
    batched = torch.empty(3, words, dtype=torch.int32)
    fill_many(states, batched, [2, 0, 1], threads)
    assert used == [pool]
    single = torch.empty(3, words, dtype=torch.int32)
    for state, row in zip(states, [2, 0, 1], strict=True):
        state.fill(single, row)
    assert torch.equal(batched, single)


def test_fill_threads_is_checked_where_it_is_set():
    from mmserve.config import EngineConfig
    from mmserve.engine.sampler import Sampler

    with pytest.raises(ValueError, match="grammar_fill_threads"):
        EngineConfig(grammar_fill_threads=-1)
    with pytest.raises(ValueError, match="grammar_fill_threads"):
        Sampler(-1)
    assert Sampler(3).fill_threads == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bitmask_through_the_pinned_buffer_on_cuda_equals_cpu():
    from mmserve.structured.bitmask import MaskBuffer

    g = torch.Generator().manual_seed(1)
    vocab = 49152
    logits = torch.randn(4, vocab, generator=g)
    buf = MaskBuffer(vocab, torch.device("cuda"))
    host = buf.take(4)
    host.copy_(torch.randint(-(2**31), 2**31 - 1, host.shape, generator=g).to(torch.int32))
    want = apply_bitmask(logits.clone(), host.clone())
    got = apply_bitmask(logits.cuda(), buf.to_device(host))
    assert torch.equal(got.cpu(), want)
    assert buf.take(2).shape == (2, bitmask_words(vocab))  # waits for the copy, then reuses
