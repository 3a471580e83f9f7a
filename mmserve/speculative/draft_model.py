"""Drafting with a model: a smaller sibling of the target (same tokenizer) on its own paged KV.

Each ``propose`` call runs the drafter model ``max(k)`` times for the whole batch: one
forward that catches every request up (the tokens of ``token_ids`` its cache lacks, see
``model_drafter.DrafterKV``) and yields the first draft token, then one single-token
forward per further draft position for the requests whose ``k`` reaches it. Every step
is one flat batch over many sequences, as in the engine.

Greedy by default: drafts are argmaxes and ``probs`` is ``None`` (verification treats
them as one-hot, which is lossless). With ``temperature_aware=True`` each draft token is
sampled from the drafter's softmax at temperature 1 and its rows are returned as
``probs`` for rejection sampling; the sampling seed is a function of the request's
``token_ids`` only, so drafts stay deterministic. The drafter's vocabulary must be the
target's (same size), or the probabilities cannot be compared.

Never fails a step: a request that does not fit the pool (or the model's positions) gets
an empty draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mmserve.kernels.attention import AttentionMetadata
from mmserve.models.base import CausalLM
from mmserve.speculative.drafter import Draft, Drafter, DraftRequest, empty_draft
from mmserve.speculative.model_drafter import CatchUp, DrafterKV

DEFAULT_KV_BYTES = 256 << 20  # the drafter's own KV pool when num_blocks is not given
_SEED_MIX = 0x9E3779B97F4A7C15  # spreads (seed, length, last token) over the 64-bit seed


@dataclass
class _Row:
    """One request being drafted this step."""

    index: int  # its place in the batch
    request: DraftRequest
    plan: CatchUp
    tokens: list[int] = field(default_factory=list)  # set by _draft at the end
    probs: list[torch.Tensor] = field(default_factory=list)  # (V,) rows, temperature_aware only
    generator: torch.Generator | None = None  # temperature_aware only


class DraftModelDrafter(Drafter):
    """Autoregressive drafts from ``model``, a cheaper LM sharing the target's tokenizer."""

    def __init__(
        self,
        model: CausalLM,
        num_blocks: int | None = None,
        block_size: int = 16,
        device: torch.device | str | None = None,
        temperature_aware: bool = False,
        seed: int = 0,
    ) -> None:
        """``num_blocks`` blocks of ``block_size`` tokens hold the drafter's KV (default: as
        many as fit in ``DEFAULT_KV_BYTES``); ``device`` defaults to the model's."""
        param = next(model.parameters())
        self.model = model
        self.device = torch.device(device) if device is not None else param.device
        self.temperature_aware = temperature_aware
        self.seed = seed
        if num_blocks is None:
            # K and V of every layer, one block of block_size tokens
            per_block = (
                2
                * model.num_layers
                * block_size
                * model.num_kv_heads
                * model.head_dim
                * param.dtype.itemsize
            )
            num_blocks = max(1, DEFAULT_KV_BYTES // per_block)
        self.kv = DrafterKV(
            model.num_layers,
            model.num_kv_heads,
            model.head_dim,
            num_blocks,
            block_size,
            param.dtype,
            self.device,
        )

    def propose(self, batch: list[DraftRequest]) -> list[Draft]:
        ids = [r.request_id for r in batch if r.k > 0]
        assert len(set(ids)) == len(ids), "a request appears twice in one draft batch"
        rows = [row for i, r in enumerate(batch) if (row := self._plan(i, r)) is not None]
        if rows:
            self._draft(rows)
        drafts = [empty_draft() for _ in batch]
        for row in rows:
            probs = torch.stack(row.probs) if self.temperature_aware else None
            drafts[row.index] = Draft(row.tokens, probs)
        return drafts

    def on_finished(self, request_id: str) -> None:
        self.kv.release(request_id)

    def _plan(self, index: int, request: DraftRequest) -> _Row | None:
        """The request's catch-up, or None when it gets no draft this step."""
        n, k = len(request.token_ids), request.k
        if k <= 0 or n == 0 or n + k - 1 > self.model.max_position_embeddings:
            return None
        plan = self.kv.prepare(request.request_id, request.token_ids, k)
        if plan is None:
            return None
        gen = self._generator(request.token_ids) if self.temperature_aware else None
        return _Row(index, request, plan, generator=gen)

    @torch.inference_mode()
    def _draft(self, rows: list[_Row]) -> None:
        """Fill every row's ``tokens`` (and ``probs``), then record what the cache holds.

        Drafted ids stay on the device, fed straight back as the next step's input, and
        come to the host once at the end (one sync per call, not one per position).
        """
        k_max = max(r.request.k for r in rows)
        drafted = torch.zeros(len(rows), k_max, dtype=torch.long, device=self.device)  # (R, k)
        flat = [t for r in rows for t in r.plan.tokens]
        catch_up = torch.tensor(flat, dtype=torch.long, device=self.device)  # (N,)
        logits = self._forward([(r, r.plan.start, len(r.plan.tokens)) for r in rows], catch_up)
        drafted[:, 0] = self._choose(rows, logits)
        for j in range(1, k_max):
            live = [i for i, r in enumerate(rows) if r.request.k > j]
            # draft j-1 of each live row sits at position len(token_ids) + j - 1
            seqs = [(rows[i], len(rows[i].request.token_ids) + j - 1, 1) for i in live]
            index = torch.tensor(live, device=self.device)
            logits = self._forward(seqs, drafted[index, j - 1])
            drafted[index, j] = self._choose([rows[i] for i in live], logits)
        for r, tokens in zip(rows, drafted.tolist(), strict=True):
            r.tokens = tokens[: r.request.k]
            self.kv.commit(r.request.request_id, r.request.token_ids, r.tokens[:-1])

    def _forward(self, seqs: list[tuple[_Row, int, int]], input_ids: torch.Tensor) -> torch.Tensor:
        """Run each row's ``count`` tokens (flat in ``input_ids``) at positions ``start..``
        -> (rows, V) logits of each row's last token."""
        query_lens = [count for _, _, count in seqs]
        context_lens = [start + count for _, start, count in seqs]
        tables = [self.kv.block_ids(r.request.request_id) for r, _, _ in seqs]
        meta = AttentionMetadata.build(
            query_lens, context_lens, tables, self.kv.block_size, self.device
        )
        positions = torch.cat([torch.arange(start, start + count) for _, start, count in seqs]).to(
            self.device
        )  # (N,)
        hidden = self.model(input_ids, positions, meta, self.kv.cache)  # (N, H)
        last = torch.tensor(query_lens, device=self.device).cumsum(0) - 1  # (rows,)
        return self.model.compute_logits(hidden[last])  # (rows, V)

    def _choose(self, rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
        """(rows,) next draft tokens: argmaxes, or samples at temperature 1 (probs kept)."""
        if not self.temperature_aware:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float(), dim=-1)  # (rows, V)
        samples = []
        for r, p in zip(rows, probs, strict=True):
            samples.append(torch.multinomial(p, 1, generator=r.generator))
            r.probs.append(p)
        return torch.cat(samples)

    def _generator(self, token_ids: Sequence[int]) -> torch.Generator:
        """A generator seeded from the request's history, so drafts are reproducible."""
        mixed = (self.seed * _SEED_MIX + len(token_ids)) * _SEED_MIX + int(token_ids[-1])
        return torch.Generator(device=self.device).manual_seed(mixed % (1 << 63))
