"""Grammars on xgrammar: compiled once per constraint (cached), one matcher per request.

Why xgrammar (``docs/structured-output.md`` has the table): on this engine's default
tokenizer (49k tokens) its per-step mask fill is several times cheaper than llguidance's at
batch 32 (its token-mask cache is built at compile time), which is the cost every
constrained decode step pays; llguidance compiles faster, which a cache makes a one-off.
Both roll back exactly and take JSON schemas, regexes, EBNF and tool-call tags.

``GrammarCompiler`` lives in the engine process. Importing xgrammar and reading the
vocabulary take seconds, on the engine's thread if the first constrained request paid
them (every stream would stall); ``GrammarLoader`` builds it in a background thread at
start-up instead (``EngineConfig.preload_grammar``), or on first use. ``GrammarState`` is the
per-request matcher: ``accept`` advances it by an accepted token, ``fill`` writes the mask
of the state after some not-yet-accepted tokens (a verify step's drafts) and rolls those
back, and ``valid_prefix`` says how much of a draft the grammar allows.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mmserve.errors import InvalidRequestError
from mmserve.structured.spec import StructuredOutput

_JSON_SEPARATORS = (", ", ": ")  # one space after separators, no free whitespace: a small
# model never loops on blank lines inside a document


class GrammarState:
    """One request's matcher. ``num_accepted`` counts the tokens accepted so far."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self.num_accepted = 0
        self.failed = False  # a token the grammar did not allow was accepted (a bug)

    def accept(self, token: int) -> bool:
        if self.failed or self.matcher.is_terminated():
            return False
        ok = bool(self.matcher.accept_token(token))
        self.failed = not ok
        self.num_accepted += ok
        return ok

    def fill(self, bitmask: torch.Tensor, row: int, ahead: Sequence[int] = ()) -> None:
        """Row ``row`` of the host ``bitmask``: the tokens allowed after ``ahead`` (tokens
        not accepted yet, e.g. a verify step's earlier drafts). If the grammar refuses one
        of them, the mask is that of the state before it: a row that follows a refused
        draft is never used (the target's pick before it already differs from the draft)."""
        n = self._advance(ahead)
        if not self.matcher.is_terminated():
            self.matcher.fill_next_token_bitmask(bitmask, row)
        if n:
            self.matcher.rollback(n)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows from here (state unchanged)."""
        n = self._advance(tokens)
        if n:
            self.matcher.rollback(n)
        return n

    def _advance(self, tokens: Sequence[int]) -> int:
        n = 0
        for t in tokens:
            if self.matcher.is_terminated() or not self.matcher.accept_token(t):
                break
            n += 1
        return n

    @property
    def completed(self) -> bool:
        """The grammar accepts the output so far as a whole (only a stop token may follow,
        or one was taken)."""
        return bool(self.matcher.is_completed() or self.matcher.is_terminated())

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())


_POOLS: dict[int, Any] = {}  # threads -> xgrammar BatchGrammarMatcher (its pool), made on first use
_POOLS_LOCK = threading.Lock()
SERIAL_ROWS = 64  # automatic: fewer rows than this fill on the calling thread


def check_fill_threads(threads: int) -> int:
    """``EngineConfig.grammar_fill_threads``: 0 (automatic) or a count >= 1."""
    if threads < 0:
        raise ValueError(f"grammar_fill_threads must be >= 0 (0: automatic), got {threads}")
    return threads


@functools.lru_cache(maxsize=1)
def fill_threads() -> int:
    """The automatic pool: half the CPUs this process may run on, at most 4 (read once).
    xgrammar's own default is half of ``std::thread::hardware_concurrency()``, every core
    of the host; in a container lent a few of a large host's cores that is a pool several
    times the CPUs there are. On an H100 host (16 CPUs) at 32 rows a pool of 2 or 4 took
    203-209 us a step, one of 8 410 us: starting its threads (each call) costs more
    than its fills."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    try:  # a cgroup v2 CPU quota ("max" or "<quota> <period>")
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, min(4, cpus // 2))


def fill_many(
    states: Sequence[GrammarState], bitmask: torch.Tensor, rows: Sequence[int], threads: int = 0
) -> None:
    """``states[j].fill(bitmask, rows[j])`` for every j, with nothing ahead (a step's plain
    constrained rows), on ``threads`` threads (the engine's ``grammar_fill_threads``).

    A fill of a cached grammar state is a copy of a few kB, so a pool pays off only over
    many rows: at 32 rows on an H100 host the calling thread alone took 119 us a step
    (3.7 us a row, a call a row), a pool of 2-4 threads 203-209 us (about 150-180 us of
    it starting the pool's threads). So 0 (automatic) fills fewer than ``SERIAL_ROWS`` rows
    on the calling thread and more on a pool of ``fill_threads()``; n >= 1 always uses n.
    One thread is still one batched call (xgrammar's matcher of ``max_threads=1`` fills
    inline, starting no thread): a call a row converts the bitmask tensor each time, about
    twice the cost (40 against 21 us for 32 rows of the bench's schema on the 2-core CPU)."""
    live = [
        (s.matcher, r) for s, r in zip(states, rows, strict=True) if not s.matcher.is_terminated()
    ]
    if not live:
        return
    if len(live) == 1:
        live[0][0].fill_next_token_bitmask(bitmask, live[0][1])
        return
    n = threads_for(len(live), threads)
    _pool(n).batch_fill_next_token_bitmask([m for m, _ in live], bitmask, [r for _, r in live])


def threads_for(rows: int, threads: int = 0) -> int:
    """The threads ``fill_many`` fills ``rows`` rows on under setting ``threads``."""
    return threads or (1 if rows < SERIAL_ROWS else fill_threads())


def _pool(threads: int) -> Any:
    """One batched matcher per thread count, shared by the process's engines (each fills
    on its own engine thread; a fill call is synchronous). xgrammar starts ``threads``
    threads in each call of more than one thread and joins them before it returns (the
    wake-up cost above); one thread runs in the caller."""
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            import xgrammar as xgr

            pool = _POOLS[threads] = xgr.BatchGrammarMatcher(max_threads=threads)
        return pool


class GrammarCompiler:
    """Compiles ``StructuredOutput`` constraints for one tokenizer; compiled grammars are
    cached by (kind, value), so a schema sent again costs a dictionary look-up."""

    def __init__(self, tokenizer: Any, vocab_size: int, cache_size: int = 256) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        backend = tokenizer.backend
        vocab = backend.get_vocab(with_added_tokens=True)
        encoded: list[str] = [""] * max(vocab.values(), default=-1) + [""]
        for text, i in vocab.items():
            encoded[i] = text
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
        self.info = xgr.TokenizerInfo(
            encoded,
            meta["vocab_type"],
            vocab_size=vocab_size,
            stop_token_ids=sorted(tokenizer.eos_token_ids),
            add_prefix_space=meta["add_prefix_space"],
        )
        self.compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)
        self.vocab_size = vocab_size
        self.cache: dict[tuple[str, str], Any] = {}
        self.cache_size = cache_size
        self.lock = threading.Lock()  # the server validates while the engine compiles
        self.compiles = 0

    def state(self, spec: StructuredOutput) -> GrammarState:
        return GrammarState(self.xgr.GrammarMatcher(self.compile(spec)))

    def compile(self, spec: StructuredOutput) -> Any:
        """The compiled grammar of ``spec``; ``InvalidRequestError`` with xgrammar's reason
        when it is invalid or uses what xgrammar does not support."""
        key = (spec.kind, spec.value)
        with self.lock:
            hit = self.cache.get(key)
            if hit is not None:
                return hit
            try:
                compiled = self._compile(spec)
            except Exception as err:  # xgrammar raises RuntimeError/ValueError subclasses
                raise InvalidRequestError(
                    f"the {spec.kind} constraint cannot be compiled: {_reason(err)}"
                ) from err
            if len(self.cache) >= self.cache_size:
                self.cache.pop(next(iter(self.cache)))  # oldest first
            self.cache[key] = compiled
            self.compiles += 1
            return compiled

    def _compile(self, spec: StructuredOutput) -> Any:
        c, kind, value = self.compiler, spec.kind, spec.value
        if kind == "json":
            return c.compile_json_schema(
                value, any_whitespace=False, separators=_JSON_SEPARATORS, strict_mode=True
            )
        if kind == "json_object":
            return c.compile_json_schema(
                '{"type": "object"}',
                any_whitespace=False,
                separators=_JSON_SEPARATORS,
                strict_mode=False,
            )
        if kind == "regex":
            return c.compile_regex(value)
        if kind == "choice":
            options = json.loads(value)
            return c.compile_grammar("root ::= " + " | ".join(json.dumps(o) for o in options))
        if kind == "grammar":
            return c.compile_grammar(value)
        assert kind == "structural_tag", kind
        return c.compile_structural_tag(value)


class GrammarLoader:
    """The engine's ``GrammarCompiler``, built once: ahead of need by ``start`` (a
    background thread that interpreter exit waits for), or by the first ``get``, which
    waits for a build already under way."""

    def __init__(self, build: Callable[[], GrammarCompiler]) -> None:
        self._build = build
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        # Not a daemon: exit waits for the build (seconds). A daemon thread is stopped at
        # interpreter exit when it next takes the GIL, which inside xgrammar's native code
        # (it releases the GIL there) unwinds C++ frames that may not unwind: the process
        # aborts (SIGABRT, "FATAL: exception not rethrown") instead of exiting cleanly.
        threading.Thread(target=self._preload, name="grammar-preload").start()

    def get(self) -> GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                self._compiler = self._build()
            return self._compiler

    @property
    def ready(self) -> bool:
        return self._compiler is not None

    def _preload(self) -> None:
        try:
            self.get()
        except Exception as err:  # the first constrained request raises it again, as a 400/500
            logging.getLogger("mmserve").warning("grammar preload failed: %s", err)


_WHERE = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # "[04:15:33] /project/cpp/x.cc:94: "


def _reason(err: Exception) -> str:
    text = _WHERE.sub("", str(err).strip()) or type(err).__name__
    return text.splitlines()[0] if len(text) > 400 else text
