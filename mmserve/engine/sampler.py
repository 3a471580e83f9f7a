"""Token sampling: logits ``(B, V)`` in, one token id per row out, batch invariant.

Contract
- A row's result never depends on the other rows of the batch. All tensor work is
  row-wise (ops along the vocabulary dim, elementwise ops with per-row parameters),
  every "skip this step" shortcut taken for a whole batch is an exact no-op for the
  rows that don't need the step, and all randomness comes from the row's own
  ``torch.Generator`` (in its ``SamplingState``). A seeded request therefore yields
  the same tokens alone or in any batch.
- Processing order (vLLM's): the grammar's token bitmask (structured output) -> logit_bias
  -> presence/frequency penalties (OpenAI semantics, counts
  of the request's generated tokens) -> min_tokens (EOS and stop_token_ids banned)
  -> temperature -> min_p -> top_k -> top_p. Each filter acts on the distribution
  left by the previous one. Greedy rows (``temperature == 0``) take the argmax of
  the penalized logits (ties: lowest id) and skip the filters.
- top_k keeps every token tied with the k-th largest logit. top_p keeps, in
  descending-probability order (ties: lowest id first), each token whose
  preceding cumulative probability is < top_p (so at least one token survives).
- Logprobs are ``log_softmax`` of the raw model logits (before penalties and
  temperature), as vLLM reports them by default.
- Tokens are drawn with the exponential race ``argmax(p / q)``, ``q ~ Exp(1)`` from
  the row's generator: exactly a draw from ``p``; ``sample_from_probs`` is the same
  draw for one row (speculative decoding uses it for bonus/residual tokens).
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from mmserve.sampling_params import SamplingParams
from mmserve.structured.bitmask import MaskBuffer, apply_bitmask
from mmserve.structured.grammar import GrammarState, check_fill_threads, fill_many

_MIN_TEMPERATURE = 1e-5  # below this, logits / T may overflow float32; the result is ~greedy
_TINY = 1e-30  # floor for Exp(1) noise so p / q never divides by zero


@dataclass
class SamplingState:
    """Per-request sampling state; lives in the Request for its whole life (also
    across preemption, so a recomputed request continues its random stream).

    ``output_counts`` counts the request's generated tokens (for penalties); the
    engine calls ``observe`` once per token it appends to the output, which also advances
    the request's grammar (structured output), so the grammar state always matches the
    output kept (across preemption too: the output is kept, the grammar with it).
    """

    params: SamplingParams
    generator: torch.Generator
    banned_before_min_tokens: list[int]  # EOS (unless ignore_eos) + stop_token_ids
    output_counts: dict[int, int] = field(default_factory=dict)
    num_generated: int = 0
    grammar: GrammarState | None = None  # compiled by the engine from params.structured
    bias: tuple[torch.Tensor, torch.Tensor] | None = None  # logit_bias as (ids, values)

    @classmethod
    def create(
        cls,
        params: SamplingParams,
        eos_token_ids: set[int],
        device: torch.device | str = "cpu",
        grammar: GrammarState | None = None,
    ) -> SamplingState:
        """Seed the generator from ``params.seed``, or from fresh OS randomness when None.

        ``device`` must be the device of the logits the sampler will see.
        """
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        banned = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        bias = None
        if params.logit_bias:
            ids = sorted(params.logit_bias)
            bias = (
                torch.tensor(ids, dtype=torch.long, device=device),
                torch.tensor(
                    [params.logit_bias[i] for i in ids], dtype=torch.float32, device=device
                ),
            )
        return cls(params, generator, sorted(banned), grammar=grammar, bias=bias)

    def observe(self, token_id: int) -> None:
        """Record one generated token (after it is accepted into the output)."""
        self.output_counts[token_id] = self.output_counts.get(token_id, 0) + 1
        self.num_generated += 1
        if self.grammar is not None:
            self.grammar.accept(token_id)

    def counts_with(self, extra: list[int]) -> dict[int, int]:
        """Output counts as if ``extra`` had also been generated (not recorded)."""
        if not extra:
            return self.output_counts
        counts = Counter(self.output_counts)
        counts.update(extra)
        return dict(counts)


class SampleResult(NamedTuple):
    """``token_ids[i]`` is row i's token. ``logprobs[i]`` is ``[(sampled_id, lp),
    (top1_id, lp), ..., (topN_id, lp)]`` with N = ``params.logprobs``, or None when
    the request did not ask for logprobs."""

    token_ids: list[int]
    logprobs: list[list[tuple[int, float]] | None]


def sample_from_probs(probs_row: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from the distribution ``probs_row`` (V,), using ``generator``.

    Deterministic given the generator state; consumes the same randomness as one row
    of ``Sampler.sample``. ``probs_row`` need not be normalized (only proportions matter).
    """
    noise = torch.empty_like(probs_row, dtype=torch.float32).exponential_(generator=generator)
    return int((probs_row.float() / noise.clamp_min_(_TINY)).argmax().item())


class Sampler:
    """Stateless (but for a reused host buffer for grammar bitmasks); all per-request
    state is in the ``SamplingState`` objects.

    ``extra_tokens`` (optional, one list per row) are tokens to count as already
    generated on top of the state, for penalties and min_tokens. Speculative
    verification passes the k+1 positions of one request as k+1 rows sharing one
    state, with ``extra_tokens = [[], [d1], [d1, d2], ...]``. Neither method calls
    ``observe``: the caller records the tokens it keeps. A row whose state has a grammar
    is masked by the grammar's state after its ``extra_tokens`` (a verify row's drafts),
    on the host while the step's forward runs on the device.
    """

    def __init__(self, grammar_fill_threads: int = 0) -> None:
        self._masks: dict[tuple[int, torch.device], MaskBuffer] = {}
        # threads of a step's grammar-mask fill (``fill_many``; 0: automatic)
        self.fill_threads = check_fill_threads(grammar_fill_threads)

    def sample(
        self,
        logits: torch.Tensor,
        states: list[SamplingState],
        extra_tokens: list[list[int]] | None = None,
        argmax: torch.Tensor | None = None,
    ) -> SampleResult:
        """Pick one token per row from ``logits`` (B, V); advances sampling generators.
        ``argmax``: ``logits.argmax(-1)`` where it is already computed (CUDA graphs take
        it in the graph), used when every row is greedy with nothing to apply."""
        token_ids = self.sample_tokens(logits, states, extra_tokens, argmax).tolist()
        return SampleResult(token_ids, _logprobs(logits, states, token_ids))

    def sample_tokens(
        self,
        logits: torch.Tensor,
        states: list[SamplingState],
        extra_tokens: list[list[int]] | None = None,
        argmax: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``sample``'s tokens as a (B,) tensor on the logits' device, without waiting for
        them (async scheduling feeds them to the next step on the device). Every launch
        draws from the rows' generators in the order ``sample`` would. Greedy rows with
        nothing to apply may return ``argmax`` itself (a view: copy it before the buffer
        it views is overwritten)."""
        extra = extra_tokens if extra_tokens is not None else [[] for _ in states]
        if all(
            s.params.greedy and not adjusts(s, more) for s, more in zip(states, extra, strict=True)
        ):
            # every row greedy with nothing to apply: the argmax of the logits themselves
            # (what ``process`` would return is their exact float32 copy), without a
            # per-row pass (~2 us a row on the host: 36 rows of a 4 x (8 + 1) verify step)
            return argmax if argmax is not None else logits.argmax(dim=-1)
        processed = self.process(logits, states, extra)  # (B, V)
        tokens = processed.argmax(dim=-1)  # greedy rows keep this; first max = lowest id
        rows = [i for i, s in enumerate(states) if not s.params.greedy]
        if rows:
            at = _index(rows, logits.device)
            probs = torch.softmax(processed[at], dim=-1)  # (R, V)
            noise = torch.empty_like(probs)
            for r, i in enumerate(rows):
                noise[r].exponential_(generator=states[i].generator)
            tokens[at] = (probs / noise.clamp_min_(_TINY)).argmax(dim=-1)
        return tokens

    def probs(
        self,
        logits: torch.Tensor,
        states: list[SamplingState],
        extra_tokens: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """The distribution ``sample`` draws from, (B, V) float32: after penalties,
        min_tokens, temperature, min_p, top_k and top_p; one-hot at the argmax for
        greedy rows. Consumes no randomness."""
        processed = self.process(logits, states, extra_tokens)
        out = torch.softmax(processed, dim=-1)
        rows = [i for i, s in enumerate(states) if s.params.greedy]
        if rows:
            at = _index(rows, out.device)
            hot = processed[at].argmax(dim=-1)  # (R,)
            out[at] = torch.zeros_like(out[at]).scatter_(1, hot[:, None], 1.0)
        return out

    def process(
        self,
        logits: torch.Tensor,
        states: list[SamplingState],
        extra_tokens: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """Processed float32 logits (B, V): penalized for every row; for sampling rows
        also divided by temperature and masked (-inf) by min_p/top_k/top_p."""
        assert logits.dim() == 2 and logits.shape[0] == len(states), (logits.shape, len(states))
        extra = extra_tokens if extra_tokens is not None else [[] for _ in states]
        assert len(extra) == len(states)
        x = logits.float().clone()  # (B, V)
        self._apply_grammars(x, states, extra)
        for i, (state, more) in enumerate(zip(states, extra, strict=True)):
            # most rows: nothing to do, no row view made (a view is a few us of host time
            # a row: a constrained step of 32 rows would pay it 64 times for nothing)
            if adjusts_besides_grammar(state, more):
                if state.bias is not None:
                    x[i].index_add_(0, state.bias[0], state.bias[1])
                _apply_penalties(x[i], state, more)
                _apply_min_tokens(x[i], state, more)
        rows = [i for i, s in enumerate(states) if not s.params.greedy]
        if rows:
            at = _index(rows, x.device)
            x[at] = _apply_filters(x[at], [states[i].params for i in rows])
        return x

    def _apply_grammars(
        self, x: torch.Tensor, states: list[SamplingState], extra: list[list[int]]
    ) -> None:
        """Mask the rows of ``x`` (B, V) whose request has a grammar, in place: the host
        fills their bitmasks (the device may still be running the forward), one copy
        takes them over, and one masked fill applies them."""
        rows = [i for i, s in enumerate(states) if s.grammar is not None]
        if not rows:
            return
        key = (x.shape[1], x.device)
        buf = self._masks.get(key)
        if buf is None:
            buf = self._masks[key] = MaskBuffer(x.shape[1], x.device)
        host = buf.take(len(rows))  # (R, W)
        plain: list[tuple[GrammarState, int]] = []
        for r, i in enumerate(rows):
            grammar = states[i].grammar
            assert grammar is not None
            if extra[i]:  # a verify row: the state after its earlier drafts
                grammar.fill(host, r, extra[i])
            else:
                plain.append((grammar, r))
        fill_many([g for g, _ in plain], host, [r for _, r in plain], self.fill_threads)
        at = _index(rows, x.device)
        if isinstance(at, slice):  # a view: masked in place, no gather and scatter
            apply_bitmask(x[at], buf.to_device(host))
        else:
            x[at] = apply_bitmask(x[at], buf.to_device(host))


def _on_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list as a tensor on ``device``. On CUDA through pinned memory and a
    non-blocking copy: ``torch.tensor(values, device="cuda")`` copies from pageable
    memory, which waits for everything queued on the stream (the step's forward) before
    the host can queue the sampler's kernels behind it."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)


def _index(rows: list[int], device: torch.device) -> slice | torch.Tensor:
    """Rows (ascending) to index a tensor with: a slice where they are contiguous (a
    view, no copy), else an index tensor on ``device`` (a Python list index is copied
    from pageable memory: see ``_on_device``)."""
    if rows and rows[-1] - rows[0] + 1 == len(rows):
        return slice(rows[0], rows[-1] + 1)
    return _on_device(rows, torch.long, device)


def adjusts(state: SamplingState, extra: list[int]) -> bool:
    """Whether a grammar, a logit bias, a penalty or min_tokens changes this row's logits."""
    return state.grammar is not None or adjusts_besides_grammar(state, extra)


def adjusts_besides_grammar(state: SamplingState, extra: list[int]) -> bool:
    """Whether a logit bias, a penalty or min_tokens changes this row's logits."""
    p = state.params
    return (
        state.bias is not None
        or p.presence_penalty != 0.0
        or p.frequency_penalty != 0.0
        or (
            state.num_generated + len(extra) < p.min_tokens and bool(state.banned_before_min_tokens)
        )
    )


def _apply_penalties(row: torch.Tensor, state: SamplingState, extra: list[int]) -> None:
    """OpenAI: ``logit[t] -= count[t] * frequency + (count[t] > 0) * presence``."""
    p = state.params
    if p.presence_penalty == 0.0 and p.frequency_penalty == 0.0:
        return
    counts = state.counts_with(extra)
    if not counts:
        return
    ids = _on_device(list(counts.keys()), torch.long, row.device)
    n = _on_device(list(counts.values()), torch.float32, row.device)
    row[ids] -= n * p.frequency_penalty + p.presence_penalty


def _apply_min_tokens(row: torch.Tensor, state: SamplingState, extra: list[int]) -> None:
    if state.num_generated + len(extra) < state.params.min_tokens:
        if state.banned_before_min_tokens:
            row[_on_device(state.banned_before_min_tokens, torch.long, row.device)] = float("-inf")


def _apply_filters(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, min_p, top_k, top_p on rows (R, V); disabled filters are exact no-ops."""
    rows, vocab = x.shape
    temp = _on_device(
        [max(p.temperature, _MIN_TEMPERATURE) for p in params], torch.float32, x.device
    )
    x = x / temp[:, None]
    if any(p.min_p > 0 for p in params):
        min_p = _on_device([p.min_p for p in params], torch.float32, x.device)
        # p_i >= min_p * p_max  <=>  exp(x_i - x_max) >= min_p
        rel = torch.exp(x - x.max(dim=-1, keepdim=True).values)
        x = x.masked_fill(rel < min_p[:, None], float("-inf"))
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        x = _top_k_top_p(
            x, _on_device(top_k, torch.long, x.device), _on_device(top_p, torch.float32, x.device)
        )
    return x


def _top_k_top_p(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (R, V) logits by per-row top_k (V = off) and top_p (1.0 = off)."""
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)  # (R, V)
    kth = sorted_x.gather(1, (top_k - 1)[:, None])  # (R, 1)
    sorted_x = sorted_x.masked_fill(sorted_x < kth, float("-inf"))
    probs = torch.softmax(sorted_x, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability mass strictly ahead of each token
    drop = (before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(1, order, sorted_x)


def _logprobs(
    logits: torch.Tensor, states: list[SamplingState], token_ids: list[int]
) -> list[list[tuple[int, float]] | None]:
    out: list[list[tuple[int, float]] | None] = [None] * len(states)
    rows = [i for i, s in enumerate(states) if s.params.logprobs is not None]
    if not rows:
        return out
    # (R, V), the raw model distribution
    lp = torch.log_softmax(logits[_index(rows, logits.device)].float(), dim=-1)
    for r, i in enumerate(rows):
        n = states[i].params.logprobs or 0
        entry = [(token_ids[i], float(lp[r, token_ids[i]].item()))]
        if n > 0:
            values, ids = lp[r].topk(n)
            entry += list(zip(ids.tolist(), values.tolist(), strict=True))
        out[i] = entry
    return out
