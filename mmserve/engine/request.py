"""The state of one request inside the engine.

A request is prompt ids (plus optional embedding spans) and sampling settings; the
engine appends output ids one step at a time. ``num_computed`` counts the tokens
whose KV is in the cache; everything in ``all_ids[num_computed:]`` still has to
go through the model. Preemption resets ``num_computed`` to 0 (recompute), and the
sampler, detokenizer and stop state carry on unchanged, so output is unchanged.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mmserve.engine.block_manager import BlockTable
from mmserve.engine.detokenizer import IncrementalDetokenizer
from mmserve.engine.outputs import RequestOutput, TokenLogprob
from mmserve.engine.playback import AudioSpec, AudioStream
from mmserve.engine.sampler import SamplingState
from mmserve.engine.stop import StopChecker
from mmserve.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class EmbeddingSpan:
    """Vectors that replace the token embeddings at ``start .. start + length``.

    The vectors live in the space of ``model.embed(ids)`` (after any embedding
    scale); the prompt still holds placeholder ids at those positions. A span is
    either ready (``vectors`` given) or pending: ``vectors`` is None and the span
    carries what the engine's span encoder needs to compute them (see
    ``mmserve.engine.span_encoder``). Every field of a pending span is plain data
    (a CPU tensor or bytes, a digest, ints), so it can cross a process boundary.

    - ``digest``: content hash mixed into the prefix-cache keys of the blocks the
      span covers. Required for a pending span; for a ready one it defaults to a
      hash of the vectors.
    - ``payload``: the span encoder's input (e.g. a preprocessed pixel tensor); opaque
      to the engine. Spans cut from one payload's encoding share it.
    - ``source``: the payload's content hash, the encoder-output cache's key (spans of
      one payload share it; a repeat payload is not encoded again).
    - ``length``: rows this span takes; ``offset``: the first of them in the payload's
      encoding (one image may fill several runs of placeholders).
    """

    start: int
    vectors: torch.Tensor | None = None  # (n, hidden); None until the engine encodes it
    digest: bytes = b""
    payload: Any = None
    source: bytes = b""
    length: int = 0
    offset: int = 0

    def __post_init__(self) -> None:
        if self.vectors is not None:
            self.length = self.vectors.shape[0] if self.vectors.dim() == 2 else 0
            if not self.digest:
                import hashlib

                data = self.vectors.detach().float().cpu().contiguous().numpy().tobytes()
                self.digest = hashlib.blake2b(data, digest_size=16).digest()

    @property
    def pending(self) -> bool:
        """Whether the engine still has to compute ``vectors`` from ``payload``."""
        return self.vectors is None

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(eq=False)  # identity: the scheduler's list look-ups must not compare fields
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sampling: SamplingState
    detok: IncrementalDetokenizer
    stop: StopChecker
    eos_ids: set[int]
    max_total_len: int  # context limit: prompt + output never exceeds this
    spans: list[EmbeddingSpan] = field(default_factory=list)
    audio: AudioSpec | None = None  # an audio stream's request: served by its deadlines
    arrival_time: float = field(default_factory=time.monotonic)
    # set by the engine as the request runs
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0
    table: BlockTable | None = None
    num_cached_tokens: int = 0
    text: str = ""  # stop-checked output text (may run ahead of what was sent)
    num_detok: int = 0  # output tokens the detokenizer has had (the rest: text to come)
    sent: int = 0  # characters of ``text`` already streamed
    sent_tokens: int = 0
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    first_token_time: float | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_preemptions: int = 0
    playback: AudioStream | None = None  # its stream's clock (set by the audio policy)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token(self, i: int) -> int:
        """``all_ids[i]`` without building the whole list (a step needs one token)."""
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def extra_keys(self, block_size: int) -> list[bytes | None] | None:
        """Per-block prefix-cache keys for blocks that overlap embedding spans."""
        if not self.spans:
            return None
        nblocks = -(-self.num_tokens // block_size)
        keys: list[bytes | None] = [None] * nblocks
        for s in self.spans:
            for b in range(s.start // block_size, min(nblocks, -(-s.end // block_size))):
                keys[b] = (keys[b] or b"") + s.digest + s.start.to_bytes(8, "little")
        return keys

    def take_output(self, cumulative: bool = True) -> RequestOutput:
        """The delta since the last call (text held back for stop strings stays held).
        ``cumulative`` False leaves ``token_ids`` and ``text`` empty: a consumer that
        rebuilds them from the deltas (an API server of the engine core) need not pay a
        copy of the whole output every step."""
        finished = self.status is Status.FINISHED
        text, sent = self.text, self.sent
        new_text = ""
        if len(text) > sent:  # (none for a request without text: token ids alone)
            upto = len(text) if finished else sent + self.stop.safe_len(text[sent:])
            new_text, self.sent = text[sent:upto], upto
        ids = self.output_ids
        new_ids = ids[self.sent_tokens :]
        self.sent_tokens = len(ids)
        logprobs = None
        if self.params.logprobs is not None:
            logprobs, self.pending_logprobs = self.pending_logprobs, []
        return RequestOutput(
            request_id=self.request_id,
            new_token_ids=new_ids,
            new_text=new_text,
            token_ids=list(ids) if cumulative else [],
            text=text[: self.sent] if cumulative else "",
            finished=finished,
            finish_reason=self.finish_reason,
            num_prompt_tokens=len(self.prompt_ids),
            num_cached_tokens=self.num_cached_tokens,
            new_logprobs=logprobs,
            stop_reason=self.stop_reason,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            arrival_time=self.arrival_time,
            first_token_time=self.first_token_time,
        )
