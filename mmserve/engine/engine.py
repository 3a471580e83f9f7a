"""The engine: one ``step()`` = one scheduling decision = one model forward.

    step = scheduler.schedule(drafts) -> runner.run(step.seqs)     # schedule, run
    tokens = sampler / verifier(logits) -> commit, append, finish    # update

A step may be launched early (``launch_ahead.LaunchAhead``, CUDA): the next decode
before this step's tokens reach the host, or the next step before this step's outputs
are built; either is the step the synchronous engine takes next, so tokens are the
same. Kernel work stays behind the runner (and the sampler).

The engine knows tokenization only to detokenize outputs and check stop strings;
requests arrive as token ids (plus optional embedding spans).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from mmserve.config import EngineConfig
from mmserve.engine.block_manager import BlockManager
from mmserve.engine.cuda_graphs import DEFAULT_SIZES, PREFILL_SIZES, DecodeGraphs
from mmserve.engine.deadlines import AudioPolicy
from mmserve.engine.defaults import resolve_sizes
from mmserve.engine.detokenizer import IncrementalDetokenizer
from mmserve.engine.kv_cache import KVCache, kv_cache_dtype
from mmserve.engine.launch_ahead import LaunchAhead, LaunchedStep, StepClock
from mmserve.engine.outputs import EngineStats, RequestOutput
from mmserve.engine.playback import AudioSpec
from mmserve.engine.request import EmbeddingSpan, Request, Status
from mmserve.engine.runner import ModelRunner, StepLogits
from mmserve.engine.sampler import Sampler, SampleResult, SamplingState
from mmserve.engine.scheduler import ScheduledSeq, Scheduler
from mmserve.engine.span_encoder import SpanEncoder, SpanMaterializer
from mmserve.engine.stop import StopChecker
from mmserve.engine.token_output import TokenAppender
from mmserve.errors import InvalidRequestError
from mmserve.models.base import CausalLM
from mmserve.sampling_params import SamplingParams
from mmserve.speculative.speculator import Speculator
from mmserve.structured.grammar import GrammarCompiler, GrammarLoader

log = logging.getLogger(__name__)

SPAN_GRAPH_TOKENS = 1024  # the longest chunk with an embedding span a graph replays
# several chunks in one replay: up to this many chunks (a caption job admits a wave of
# requests at once) of up to this many tokens (an image prompt is about a hundred)
CHUNK_GRAPH_SIZES = (2, 4, 8, 16, 32)
CHUNK_GRAPH_TOKENS = 256


class _Picked(NamedTuple):
    """A step's sampled tokens (None: nothing sampled on the host this step) and, per
    sequence, which of them are its own (None: a prefill chunk, or a sampled verify
    that does its own rejection sampling)."""

    sampled: SampleResult | None
    picks: list[slice | None]


@dataclass
class _Update:
    """What a step's update emitted: the requests with outputs, in order, and the
    per-token work (detokenizing, stop checks) it took."""

    done: list[Request] = field(default_factory=list)
    emit_s: float = 0.0  # seconds of per-token work
    emitted: int = 0  # tokens
    emitters: int = 0  # sequences that emitted

    @property
    def share(self) -> float:
        """The part of the per-token work beyond one token a sequence."""
        return 1.0 - self.emitters / self.emitted if self.emitted > self.emitters else 0.0


def audio_policy(config: EngineConfig, max_num_seqs: int) -> AudioPolicy:
    """The scheduler's audio policy as ``config`` sets it."""
    return AudioPolicy(
        config.audio_scheduling,
        config.audio_window or max_num_seqs,
        config.audio_lead_s,
        config.audio_queue_s,
    )


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        model: CausalLM,
        tokenizer,
        max_model_len: int,
        device: torch.device,
        dtype: torch.dtype,
        spec: Speculator | None = None,
        span_encoder: SpanEncoder | None = None,
    ) -> None:
        bs = config.block_size
        kv_dtype = kv_cache_dtype(config.kv_cache_dtype, dtype)
        per_token = KVCache.bytes_per_block(
            model.num_layers, 1, model.num_kv_heads, model.head_dim, kv_dtype
        )
        # unset sizes (max_num_seqs, step budget, KV memory) from the device and the model
        config, self.sizes = resolve_sizes(config, device, per_token, max_model_len)
        self.config, self.model, self.tokenizer = config, model, tokenizer
        self.max_model_len, self.device, self.dtype = max_model_len, device, dtype
        self.connector: Any = None  # a vision connector, when one is served (factory)
        if config.num_kv_blocks is not None:
            self.kv = KVCache(
                model.num_layers,
                config.num_kv_blocks,
                bs,
                model.num_kv_heads,
                model.head_dim,
                kv_dtype,
                device,
            )
        else:
            self.kv = KVCache.from_budget(
                self.sizes.kv_cache_memory_mb << 20,
                model.num_layers,
                bs,
                model.num_kv_heads,
                model.head_dim,
                kv_dtype,
                device,
            )
        capacity = self.kv.num_blocks * bs
        if capacity < max_model_len:  # one sequence must always fit alone
            self.max_model_len = capacity
        self.blocks = BlockManager(self.kv.num_blocks, bs, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.blocks,
            self.sizes.max_num_seqs,
            self.sizes.max_num_batched_tokens,
            config.max_waiting,
            config.prefill_chunk_tokens,
            audio_policy(config, self.sizes.max_num_seqs),
        )
        # (blocks a sequence, chunk lengths) of the prefill graphs, once captured
        self._prefill_shape: tuple[int, tuple[int, ...]] | None = None
        graphs = self._capture_graphs(model, device)
        self.runner = ModelRunner(model, self.kv, bs, *(graphs or (None, None)))
        self.sampler = Sampler(config.grammar_fill_threads)
        self.appender = TokenAppender(tokenizer)
        self.spec = spec
        self._spec_off: Speculator | None = None  # the speculator while switched off
        # async scheduling: on CUDA only (on CPU a step launched ahead runs at once, so
        # there is nothing to overlap; tests switch it on there to check its bookkeeping)
        self.launch = LaunchAhead(
            config.async_scheduling and device.type == "cuda",
            self.scheduler,
            self.blocks,
            self.runner,
            self.sampler,
        )
        self.spans: SpanMaterializer | None = None  # computes pending embedding spans
        if span_encoder is not None:
            self.set_span_encoder(span_encoder)
        if spec is not None and self.runner.graphs is not None:
            # graph replays pad a verify step's sequences to one length, a query bucket
            spec.controller.padded = True
            spec.controller.query_sizes = tuple(self.runner.graphs.qsizes)
        self.requests: dict[str, Request] = {}
        self._grammars = GrammarLoader(lambda: GrammarCompiler(tokenizer, model.vocab_size))
        if config.preload_grammar:
            self._grammars.start()
        self._ids = itertools.count()
        self._ran_nothing = False  # the last step scheduled nothing (``idle_for``)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.steps_total = self.step_seqs_total = 0  # steps run, and their sequences
        # outputs carry the cumulative token_ids/text (False: deltas only; the engine core
        # sets it, its API servers rebuild them)
        self.cumulative_outputs = True

    def _capture_graphs(
        self, model: CausalLM, device: torch.device
    ) -> tuple[DecodeGraphs, DecodeGraphs] | None:
        """CUDA: capture decode and verify steps for a set of batch sizes, and batch-1
        prefill chunks for a set of lengths; capture time/memory logged."""
        if device.type != "cuda" or self.config.enforce_eager:
            return None
        sizes = tuple(b for b in DEFAULT_SIZES if b <= self.sizes.max_num_seqs) or (1,)
        spec = self.config.spec_config()
        # verify steps too: k + 1 tokens per sequence, in a few buckets up to k_max + 1
        top = spec.max_tokens_per_step + 1 if spec is not None else 1
        qs = tuple(q for q in (1, 2, 3, 5, 9, 17, 33, 65) if q < top) + (top,)
        blocks = -(-self.max_model_len // self.config.block_size)
        graphs = DecodeGraphs(model, self.kv, blocks, sizes, qs)
        report = graphs.capture()
        log.info(
            "captured CUDA graphs for decode batch sizes %s in %.2fs using %.0f MiB",
            report.batch_sizes,
            report.seconds,
            report.pool_bytes / 2**20,
        )
        self.graph_report = report
        chunk = min(self.sizes.max_num_batched_tokens, self.max_model_len)
        lengths = tuple(q for q in PREFILL_SIZES if q < chunk) + (chunk,)
        prefill = DecodeGraphs(model, self.kv, blocks, (1,), lengths, last_row_only=True)
        report = prefill.capture()
        log.info(
            "captured CUDA graphs for batch-1 prefill chunks of %s tokens in %.2fs using %.0f MiB",
            lengths,
            report.seconds,
            report.pool_bytes / 2**20,
        )
        self._prefill_shape = (blocks, lengths)
        return graphs, prefill

    def _capture_span_graphs(self) -> None:
        """CUDA: prefill chunks that start from input embeddings, so a chunk with an
        embedding span (an image) replays a graph too, and a step's chunks replay
        together (``runner`` module docstring): batch 1 up to ``SPAN_GRAPH_TOKENS`` (an
        image prompt is a few hundred tokens), and ``CHUNK_GRAPH_SIZES`` chunks at once
        up to ``CHUNK_GRAPH_TOKENS``."""
        shape = self._prefill_shape
        if shape is None or self.runner.span_prefill_graphs is not None:
            return
        blocks, lengths = shape
        lengths = tuple(q for q in lengths if q <= SPAN_GRAPH_TOKENS) or lengths[:1]
        graphs = DecodeGraphs(
            self.model, self.kv, blocks, (1,), lengths, last_row_only=True, embeds_input=True
        )
        report = graphs.capture()
        log.info(
            "captured CUDA graphs for batch-1 prefill chunks from embeddings of %s tokens "
            "in %.2fs using %.0f MiB",
            lengths,
            report.seconds,
            report.pool_bytes / 2**20,
        )
        self.runner.span_prefill_graphs = graphs
        sizes = tuple(b for b in CHUNK_GRAPH_SIZES if b <= self.sizes.max_num_seqs)
        lengths = tuple(q for q in lengths if q <= CHUNK_GRAPH_TOKENS)
        if not sizes or not lengths:
            return
        chunks = DecodeGraphs(
            self.model, self.kv, blocks, sizes, lengths, last_row_only=True, embeds_input=True
        )
        report = chunks.capture()
        log.info(
            "captured CUDA graphs for %s prefill chunks at once of %s tokens in %.2fs "
            "using %.0f MiB",
            sizes,
            lengths,
            report.seconds,
            report.pool_bytes / 2**20,
        )
        self.runner.chunk_graphs = chunks

    def set_span_encoder(self, encoder: SpanEncoder) -> None:
        """Register what computes pending embedding spans (a vision connector, say), with
        an encoder-output cache of ``EngineConfig.encoder_cache_mb``."""
        hidden = self.model.embed_tokens.embedding_dim
        if encoder.hidden_size != hidden:
            raise ValueError(
                f"the span encoder gives {encoder.hidden_size}-dim vectors; the "
                f"model embeds tokens in {hidden} dims"
            )
        self.spans = self.launch.spans = SpanMaterializer(
            encoder, self.config.encoder_cache_mb << 20
        )
        self._capture_span_graphs()

    # -- requests --------------------------------------------------------------------
    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        spans: list[EmbeddingSpan] | None = None,
        audio: AudioSpec | None = None,
    ) -> str:
        """Queue a request; raises InvalidRequestError / QueueFullError without side effects."""
        request_id = request_id or f"req-{next(self._ids)}"
        self._validate(prompt_ids, params, request_id, spans or [])
        grammar = self.grammars.state(params.structured) if params.structured else None
        limit = len(prompt_ids) + (params.max_tokens or self.max_model_len)
        req = Request(
            request_id,
            list(prompt_ids),
            params,
            SamplingState.create(params, self.tokenizer.eos_token_ids, self.device, grammar),
            IncrementalDetokenizer(
                self.tokenizer.backend,
                prompt_ids,
                params.skip_special_tokens,
                getattr(self.tokenizer, "all_special_ids", None),
            ),
            StopChecker(params.stop, params.include_stop_str_in_output),
            set(self.tokenizer.eos_token_ids),
            min(limit, self.max_model_len),
            list(spans or []),
            audio,
        )
        self.scheduler.add(req)
        if audio is not None:
            self.scheduler.policy.attach(req)
        self.requests[request_id] = req
        self.prompt_tokens_total += len(prompt_ids)
        return request_id

    def _validate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        spans: list[EmbeddingSpan],
    ) -> None:
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty; give at least one token")
        vocab = self.model.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
        if any(not 0 <= t < vocab for t in params.stop_token_ids):
            raise InvalidRequestError(f"stop_token_ids must be in [0, {vocab})")
        if len(prompt_ids) + 1 > self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_ids)} tokens; this model's context is "
                f"{self.max_model_len} tokens, so the prompt may have at most "
                f"{self.max_model_len - 1}"
            )
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise InvalidRequestError(f"logit_bias token ids must be in [0, {vocab})")
        for sp in spans:
            if sp.pending and self.spans is None:
                raise InvalidRequestError(
                    "this request carries image (or other encoded) input, but the engine has "
                    "no encoder for it; serve with a connector"
                )
            if sp.pending and (sp.payload is None or not sp.source or not sp.digest):
                raise InvalidRequestError(
                    "a pending embedding span needs a payload, its "
                    "source digest and a prefix-cache digest"
                )
            ready = sp.pending or (sp.vectors is not None and sp.vectors.dim() == 2)
            if not ready or sp.length < 1 or sp.start < 0 or sp.end > len(prompt_ids):
                raise InvalidRequestError(
                    f"embedding span at {sp.start} of {sp.length} vectors does not fit "
                    f"a prompt of {len(prompt_ids)} tokens"
                )

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.pop(request_id, None)
        if req is None or req.finished:
            return None
        self.scheduler.finish(req)
        self.scheduler.policy.detach(req, aborted=True)
        if self.spec is not None:
            self.spec.forget(request_id)
        req.finish_reason = "abort"
        return req.take_output(self.cumulative_outputs)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def set_speculation(self, enabled: bool) -> None:
        """Switch speculative decoding off or back on between requests: plain decode on
        the same weights, KV cache and CUDA graphs (``mmserve bench spec`` compares the
        two on one engine, so memory placement cannot favour either side)."""
        if self.has_unfinished():
            raise RuntimeError("speculation can only be switched with no request in flight")
        spec = self.speculator
        if spec is None:
            raise ValueError("this engine was built without a speculative_config")
        self.spec, self._spec_off = (spec, None) if enabled else (None, spec)

    @property
    def grammars(self) -> GrammarCompiler:
        """Compiles structured-output constraints (built at start-up in the background
        with ``preload_grammar``, else by the first constraint)."""
        return self._grammars.get()

    @property
    def async_scheduling(self) -> bool:
        """Whether steps may be launched early (``launch_ahead``)."""
        return self.launch.enabled

    @async_scheduling.setter
    def async_scheduling(self, enabled: bool) -> None:
        self.launch.enabled = enabled

    @property
    def ahead_steps(self) -> int:
        """Decode steps launched before the last step's tokens reached the host."""
        return self.launch.ahead_steps

    @property
    def prelaunched_steps(self) -> int:
        """Steps launched before the last step's outputs were built."""
        return self.launch.prelaunched_steps

    @property
    def speculator(self) -> Speculator | None:
        """The engine's speculator, switched on or off (None: built without one)."""
        return self.spec or self._spec_off

    # -- the step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduling decision, one forward, its outputs: schedule -> run -> update."""
        self._ran_nothing = False
        step, clock = self.launch.take()  # a step launched early, in the last call
        if step is None:
            step = self._schedule_and_run()
        if step is None:
            return self._idle()
        self.steps_total += 1
        self.step_seqs_total += len(step.seqs)
        picked = self._pick(step)
        update = self._update(step, picked)
        self._record(step, clock, update)
        return self._outputs(step, update)

    def _schedule_and_run(self) -> LaunchedStep | None:
        """Draft, schedule and launch a step (None: nothing to run)."""
        drafts, quiet = None, False
        if self.spec is not None:
            drafts = self.spec.propose(self.scheduler.running, len(self.scheduler.waiting))
            quiet = self.spec.quiet
            if drafts:
                drafts = self._grammar_drafts(drafts)
        seqs = self.scheduler.schedule(drafts).seqs
        if not seqs:
            return None
        if self.spans is not None:  # pending spans the chunks read: one batched encode
            self.spans.fill((s.req, s.start, s.start + s.num_real) for s in seqs if s.req.spans)
        return LaunchedStep(seqs, self.runner.run(seqs), quiet)

    def _idle(self) -> list[RequestOutput]:
        self._ran_nothing = True
        self.scheduler.policy.idle()
        return self._refused()

    def _pick(self, step: LaunchedStep) -> _Picked:
        """The step's tokens: picked on the device (the next decode launched before they
        are brought to the host, when it may be) or sampled on the host."""
        cur = self.launch.on_device(step)
        if cur is None:
            return _Picked(*self._sample(step.seqs, step.result))
        self.launch.launch_next(cur, self.spec)
        ids = self.launch.token_ids(cur)
        return _Picked(
            SampleResult(ids, [None] * len(ids)), [slice(i, i + 1) for i in range(len(ids))]
        )

    def _update(self, step: LaunchedStep, picked: _Picked) -> _Update:
        """Verify drafts, advance each request's computed length, commit full blocks,
        append its new tokens and finish the requests that ended."""
        now = time.monotonic()
        update = _Update()
        sampled = picked.sampled
        for s, rows, pick in zip(step.seqs, step.result.rows, picked.picks, strict=True):
            req = s.req
            if req.status is Status.FINISHED:  # a step run ahead: its request finished
                continue  # (or was aborted)
            if not rows:  # a prefill chunk that has not reached the end of the prompt
                req.num_computed = s.start + s.num_tokens
                self._commit(req)
                continue
            if s.draft:
                tokens, logprobs = self._tokens(s, rows, pick, step.result, sampled)
            else:  # a plain row (most rows of most steps): its slice of the batch's tokens
                assert sampled is not None and isinstance(pick, slice)
                tokens, logprobs = sampled.token_ids[pick], sampled.logprobs[pick]
            # KV is valid for the real tokens and the accepted drafts, not the rejected ones
            req.num_computed = s.start + s.num_real + len(tokens) - 1
            if s.draft:
                self.blocks.truncate(req.table, req.num_computed)  # type: ignore[arg-type]
            self._commit(req)
            req.first_token_time = req.first_token_time or now
            t = time.perf_counter()
            # text that can end nothing (no stop strings) waits for the next launch
            self.generation_tokens_total += self.appender.append(
                req, tokens, logprobs, defer_text=self.async_scheduling and not req.stop
            )
            update.emit_s += time.perf_counter() - t
            update.emitted += len(tokens)
            update.emitters += 1
            if req.status is Status.FINISHED:
                self._finish(req)
            update.done.append(req)
        return update

    def _tokens(
        self,
        s: ScheduledSeq,
        rows: list[int],
        pick: slice | None,
        result: StepLogits,
        sampled: SampleResult | None,
    ) -> tuple[list[int], list]:
        """A verify's new tokens (its accepted drafts and the target's next token) and
        their logprobs."""
        assert self.spec is not None and s.draft
        if pick is not None:  # greedy: the target's tokens came from the batch call
            assert sampled is not None
            tokens = self.spec.verify_greedy(s, sampled.token_ids[pick])
        else:
            tokens = self.spec.verify(s, result.logits[rows], self.sampler)
        return tokens, [None] * len(tokens)

    def _record(self, step: LaunchedStep, clock: StepClock, update: _Update) -> None:
        """Give the speculator the step's cost: the whole step (on CUDA the forward alone
        is asynchronous), less the per-token work beyond one token a sequence, what a
        plain step emits (a token costs it whichever step emits it, so it is no price of
        verifying)."""
        if self.spec is None:
            return
        seconds = time.perf_counter() - clock.start - update.emit_s * update.share - clock.carried
        self.spec.record_step(
            step.result.num_rows,
            seconds,
            any(s.draft for s in step.seqs),
            step.result.graph,
            update.emitted,
            update.emitters,
            step.quiet,
        )

    def _outputs(self, step: LaunchedStep, update: _Update) -> list[RequestOutput]:
        """Launch the next step if its tokens are all in (the same step the synchronous
        engine takes next), then build this step's text and outputs while it runs."""
        self.launch.prelaunch(self._schedule_and_run)
        if not self.scheduler.has_work():
            self.launch.settle()
        t = time.perf_counter()
        for req in update.done:
            self.appender.catch_up(req)
        if self.launch.pending is not None:  # that text work falls in the next step's time
            self.launch.carried_emit = (time.perf_counter() - t) * update.share
        policy = self.scheduler.policy
        seqs = step.seqs
        policy.end_step(len(seqs), sum(s.num_tokens for s in seqs), self.scheduler.has_work())
        cumulative = self.cumulative_outputs
        return [
            req.take_output(cumulative) for req in update.done if policy.releases(req)
        ] + self._refused()

    def _refused(self) -> list[RequestOutput]:
        """Outputs for the waiting audio streams the audio policy refused this step."""
        outs = []
        for req in self.scheduler.refused:
            self._finish(req)
            req.finish_reason = "overloaded"
            outs.append(req.take_output(self.cumulative_outputs))
        self.scheduler.refused.clear()
        return outs

    def idle_for(self) -> float:
        """After a step that ran nothing: seconds until a request the audio policy skipped
        or queued may run (0: step again now), so the step loop can sleep, not spin."""
        sched = self.scheduler
        if not self._ran_nothing or not sched.has_work():
            return 0.0
        now = sched.policy.clock()
        wake = sched.policy.next_wake(now, sched.running, sched.waiting)
        return 0.0 if wake is None else max(0.0, wake - now)

    def _grammar_drafts(self, drafts: dict[str, list[int]]) -> dict[str, list[int]]:
        """Drafts cut at the first token a constrained request's grammar refuses (a token
        the target could never pick after the mask: verifying it would be wasted rows)."""
        out = {}
        for request_id, draft in drafts.items():
            req = self.requests.get(request_id)
            grammar = req.sampling.grammar if req is not None else None
            if grammar is not None:
                draft = draft[: grammar.valid_prefix(draft)]
                if not draft and self.spec is not None:  # as a drafter that found nothing
                    self.spec.controller.no_draft(request_id)
            if draft:
                out[request_id] = draft
        return out

    def _sample(
        self, seqs: list[ScheduledSeq], result: StepLogits
    ) -> tuple[SampleResult | None, list[slice | None]]:
        """One sampler call for every plain row and every row of a greedy verify; the
        second list says which of its tokens are each sequence's (None: not sampled here:
        a prefill chunk, or a sampled verify that does its own rejection sampling).
        One call means one device sync a step, not one per speculating request."""
        rows: list[int] = []
        states: list[SamplingState] = []
        extra: list[list[int]] = []
        picks: list[slice | None] = []
        for s, r in zip(seqs, result.rows, strict=True):
            if not r or (s.draft and not s.req.params.greedy):
                picks.append(None)
                continue
            mine = r if s.draft else r[:1]
            picks.append(slice(len(rows), len(rows) + len(mine)))
            rows += mine
            states += [s.req.sampling] * len(mine)
            extra += [s.draft[:j] for j in range(len(mine))]  # penalties see earlier drafts
        if not rows:
            return None, picks
        # rows only ever increase: a contiguous run (every plain decode step, a greedy
        # verify without padding rows) is a view, not a gather of (rows, vocab) floats
        pick: slice | list[int] = (
            slice(rows[0], rows[-1] + 1) if rows[-1] - rows[0] + 1 == len(rows) else rows
        )
        argmax = result.argmax[pick] if result.argmax is not None else None
        return self.sampler.sample(result.logits[pick], states, extra, argmax), picks

    def _commit(self, req: Request) -> None:
        """Offer the newly full blocks of computed tokens to the prefix cache."""
        table, bs = req.table, self.config.block_size
        assert table is not None
        if not self.blocks.enable_prefix_caching or req.num_computed // bs <= len(
            table.block_hashes
        ):
            return  # no block filled up this step (most steps): skip copying the context
        self.blocks.commit_full_blocks(table, req.all_ids[: req.num_computed], req.extra_keys(bs))

    def _finish(self, req: Request) -> None:
        self.scheduler.finish(req)
        self.scheduler.policy.detach(req)
        self.requests.pop(req.request_id, None)
        if self.spec is not None:
            self.spec.forget(req.request_id)

    def stats(self) -> EngineStats:
        return EngineStats(
            kv_blocks_total=self.blocks.num_total_blocks,
            kv_blocks_used=self.blocks.num_used_blocks,
            kv_blocks_free=self.blocks.num_free_blocks,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            preemptions_total=self.scheduler.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            prefix_cache_hit_tokens_total=self.blocks.prefix_hits,
            prefix_cache_query_tokens_total=self.blocks.prefix_queries,
            steps_total=self.steps_total,
            step_seqs_total=self.step_seqs_total,
            prompt_steps_total=self.scheduler.prompt_steps,
            steps_ahead_total=self.launch.ahead_steps,
            steps_prelaunched_total=self.launch.prelaunched_steps,
            ahead_admissions_total=self.launch.ahead_admissions,
            **self.scheduler.policy.stats(),
            **self._encoder_stats(),
            **self._spec_stats(),
        )

    def _encoder_stats(self) -> dict:
        if self.spans is None:
            return {}
        st = self.spans.stats
        return {
            "encoder_calls_total": st.encoder_calls,
            "encoder_payloads_total": st.encoded_payloads,
            "encoder_cache_hits_total": st.cache_hits,
        }

    def _spec_stats(self) -> dict:
        spec = self.speculator
        if spec is None:
            return {}
        totals = spec.controller.totals()
        return {
            "spec_guard_pauses_total": spec.controller.pauses,
            "spec_num_drafts_total": totals.num_drafts,
            "spec_draft_tokens_total": totals.num_draft_tokens,
            "spec_accepted_tokens_total": totals.num_accepted_tokens,
            "spec_acceptance_by_position": spec.controller.acceptance_by_position(),
        }


__all__ = ["LLMEngine", "Status", "ScheduledSeq"]
