"""What the engine hands back: one ``RequestOutput`` delta per step per request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenLogprob:
    """Log-probability of one generated token and the top alternatives (OpenAI shape)."""

    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)  # (id, text, logprob)


@dataclass
class RequestOutput:
    """A streaming delta for one request; ``text``/``token_ids`` hold everything so far."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "overloaded" | None: running
    num_prompt_tokens: int
    num_cached_tokens: int = 0
    new_logprobs: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    num_draft_tokens: int = 0  # drafted by speculation so far
    num_accepted_tokens: int = 0  # of those, accepted by verification
    arrival_time: float = 0.0
    first_token_time: float | None = None
    # set by an output stage on the engine thread (``AsyncEngine``): speech's PCM of this
    # delta's frames (float32 numpy at the voice's sample rate)
    audio: Any = None


def coalesce(deltas: list[RequestOutput]) -> RequestOutput:
    """One delta for consecutive deltas of a request (what a consumer that fell behind
    reads: one event, not one per step). The last delta is reused: a stream's deltas are
    its own, and a merge costs a few list and string joins. Text only: an output stage's
    audio is per step."""
    last = deltas[-1]
    if len(deltas) == 1:
        return last
    assert all(d.audio is None for d in deltas), "audio deltas are not merged"
    last.new_token_ids = [t for d in deltas for t in d.new_token_ids]
    last.new_text = "".join(d.new_text for d in deltas)
    if any(d.new_logprobs is not None for d in deltas):
        last.new_logprobs = [lp for d in deltas for lp in d.new_logprobs or []]
    return last


@dataclass
class EngineStats:
    """A snapshot of engine counters for /metrics (totals are monotonic)."""

    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    num_running: int
    num_waiting: int
    preemptions_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    prefix_cache_hit_tokens_total: int
    prefix_cache_query_tokens_total: int
    spec_num_drafts_total: int = 0  # verify steps that carried at least one draft token
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0
    spec_guard_pauses_total: int = 0  # drafting paused: verify steps delivered < plain
    spec_acceptance_by_position: list[float] = field(default_factory=list)
    encoder_calls_total: int = 0  # batched span-encoder calls (at most one a step)
    encoder_payloads_total: int = 0  # payloads (images) that went through the encoder
    encoder_cache_hits_total: int = 0  # payloads served from the encoder-output cache
    # the step loop: steps run, sequences they ran (their mean: the batch), steps with a
    # prompt chunk, steps launched before the last step's tokens reached the host
    # (``ahead``) or before its outputs were built (``prelaunched``), requests admitted
    # into a step launched ahead
    steps_total: int = 0
    step_seqs_total: int = 0
    prompt_steps_total: int = 0
    steps_ahead_total: int = 0
    steps_prelaunched_total: int = 0
    ahead_admissions_total: int = 0
    audio_streams_active: int = 0  # audio streams the engine holds (playing or queued)
    audio_streams_refused_total: int = 0  # refused by admission control (deadline mode)
