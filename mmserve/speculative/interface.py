"""What speculation reads of the engine's objects, as structural types.

``mmserve.speculative`` never imports ``mmserve.engine``: the engine owns a
``Speculator`` and hands it its requests, scheduled sequences and sampler, which
satisfy these protocols. The dependency runs one way (engine -> speculative), so the
engine's data types can change without speculation importing them, and speculation
can be tested on its own.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from mmserve.sampling_params import SamplingParams


class SpecRequest(Protocol):
    """One running request as speculation sees it (``mmserve.engine.request.Request``)."""

    request_id: str
    params: SamplingParams
    sampling: Any  # the sampler's per-request state, handed back to the sampler as is
    num_computed: int  # tokens whose KV is in the cache
    max_total_len: int  # prompt + output never exceeds this
    num_draft_tokens: int  # counters speculation keeps for the request's output
    num_accepted_tokens: int

    @property
    def num_tokens(self) -> int: ...

    @property
    def all_ids(self) -> list[int]: ...


class VerifySeq(Protocol):
    """A scheduled sequence whose step verifies ``draft`` (``engine.scheduler.ScheduledSeq``)."""

    @property
    def req(self) -> SpecRequest: ...

    @property
    def draft(self) -> list[int]: ...


class TargetResult(Protocol):
    """The target sampler's tokens, one per row."""

    @property
    def token_ids(self) -> list[int]: ...


class TargetSampler(Protocol):
    """The engine's sampler (``engine.sampler.Sampler``): its picks and its distribution,
    with the request's penalties applied as if ``extra[i]`` had been emitted before row i."""

    def sample(
        self, logits: torch.Tensor, states: list[Any], extra_tokens: list[list[int]] | None = None
    ) -> TargetResult: ...

    def probs(
        self, logits: torch.Tensor, states: list[Any], extra_tokens: list[list[int]] | None = None
    ) -> torch.Tensor: ...
