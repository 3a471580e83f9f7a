"""The drafter interface: what every speculative drafter promises the engine.

A drafter guesses the next few tokens of each request cheaply; the target model then
verifies them in one forward pass (``mmserve.speculative.verify``). The engine asks the
controller (``mmserve.speculative.controller``) how many tokens ``k`` to draft per request,
calls ``Drafter.propose`` once per step with every request that has ``k > 0``, and
calls ``Drafter.on_finished`` when a request ends (finished, cancelled or aborted).

Drafters know nothing about the target model, the KV cache or sampling: token ids
in, draft token ids (and optionally the drafter's own probabilities) out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class DraftRequest:
    """What a drafter sees of one request this step.

    ``token_ids`` is the request's prompt followed by its output so far. It is the
    engine's own buffer: a drafter must treat it as read-only and must not copy all of
    it each step (that would make the step cost grow with the context length).
    Between two calls for the same ``request_id`` it only grows by appending.
    """

    request_id: str
    token_ids: Sequence[int]
    k: int  # max tokens to draft (the controller's choice); 0 = skip this request
    # draft only from a match of at least this many context tokens (drafters that copy
    # from a match honour it; others match more than this anyway or do not match)
    min_match: int = 1


@dataclass
class Draft:
    """The drafted tokens of one request, at most ``k`` of them (possibly none).

    ``probs`` is the drafter's real distribution at each drafted position, shape
    ``(len(tokens), V)``, each token sampled from its row. ``None`` means the drafter
    is deterministic; verification then treats each drafted token as one-hot, which
    keeps sampling lossless.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.probs is not None:
            assert self.probs.dim() == 2 and self.probs.shape[0] == len(self.tokens), (
                f"draft probs must be (len(tokens)={len(self.tokens)}, V), "
                f"got {tuple(self.probs.shape)}"
            )


def empty_draft() -> Draft:
    """A draft with no tokens (the request decodes one token as usual)."""
    return Draft(tokens=[])


class Drafter(ABC):
    """Proposes draft tokens for a batch of requests.

    Contract:

    - ``propose(batch)`` returns exactly one ``Draft`` per ``DraftRequest``, in order,
      with ``len(draft.tokens) <= request.k``; ``k == 0`` gives an empty draft. It may
      return fewer tokens than ``k`` (or none) when it has no good guess.
    - Pure with respect to the target: it never touches the target model, its KV
      cache, the sampler or the request's buffers; it only reads ``token_ids``.
    - Deterministic: the draft depends only on the request's ``token_ids`` and ``k``
      (and the drafter's fixed configuration), not on the rest of the batch, its order
      or earlier calls. Per-request caches are allowed only as an optimisation that
      does not change the result.
    - ``on_finished(request_id)`` releases any per-request state; calling it for an
      unknown id is a no-op. After it, the id may be reused for a new request.
    - ``prepare(request)`` may build per-request caches ahead of the first ``propose``
      (the speculator calls it before a request's first draft and keeps its time out of
      the step's measured cost); it changes no draft.
    """

    @abstractmethod
    def propose(self, batch: list[DraftRequest]) -> list[Draft]:
        """One draft per request, in order; see the class docstring for the rules."""

    def on_finished(self, request_id: str) -> None:  # noqa: B027 - stateless default
        """Release per-request state. Stateless drafters need not override this."""

    def has_match(self, request: DraftRequest) -> bool | None:
        """Whether ``propose`` would draft anything for ``request`` (its ``k`` ignored),
        told more cheaply than drafting; None: cannot tell without drafting. The
        controller may ask before planning a probe (planning one costs more than a
        look-up) and then not plan it."""
        return None

    def prepare(self, request: DraftRequest) -> None:  # noqa: B027 - stateless default
        """Build per-request caches for ``request.token_ids`` (``k`` is ignored) before the
        first ``propose``: off the decode steps whose cost decides speculation."""
