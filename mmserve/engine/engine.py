"""The engine: one ``step()`` = one scheduling decision = one forward.

    schedule = scheduler.schedule(drafts); logits = runner.run(schedule.seqs);
    tokens = sampler/verifier(logits); postprocess(tokens) -> RequestOutputs

Async scheduling (CUDA, ``EngineConfig.async_scheduling``): when a step is a plain decode
of every running request and each request's token can be picked on the device (greedy:
the argmax; sampled: a draw from the request's own generator; no logprobs, penalties or
min_tokens to apply), the next step (the same requests, one position on, its input
tokens taken on the device from this step's picks) is launched before this step's
tokens are brought to the host, so the host's postprocessing and the next launch run
while the GPU computes. A step returns its own outputs, as a synchronous one does; a
request that this step finishes (EOS, a stop string) drops its row of the step already
running, and its KV there lands in blocks it has just freed, written before any later
step can reuse them (one stream). Tokens are those of the synchronous engine: the same
steps, kernels and graphs, and batch invariance for any row dropped; a sampled row is
drawn when its step is launched, from its generator, in the synchronous engine's order.
Any other step (logprobs, penalties, a verify, a prefill) is prelaunched: launched once the last
step's tokens are in and committed, before that step's text (for requests without stop
strings, whose text can end nothing) and outputs are built, so those and the caller's
work between steps overlap its forward. It is the step the synchronous engine would take
next, proposed and scheduled from the same state; speculation records each step's cost
before choosing the next, as it does synchronously, and a step launched in an earlier
call is timed from the last step's record (one whole period).

The engine knows tokenization only to detokenize outputs and check stop strings;
requests arrive as token ids (plus optional embedding spans).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from mmserve.config import EngineConfig
from mmserve.engine.block_manager import BlockManager, BlockTable
from mmserve.engine.cuda_graphs import DEFAULT_SIZES, PREFILL_SIZES, DecodeGraphs
from mmserve.engine.deadlines import AudioPolicy
from mmserve.engine.defaults import resolve_sizes
from mmserve.engine.detokenizer import IncrementalDetokenizer
from mmserve.engine.kv_cache import KVCache, kv_cache_dtype
from mmserve.engine.outputs import EngineStats, RequestOutput
from mmserve.engine.playback import AudioSpec
from mmserve.engine.request import EmbeddingSpan, Request, Status
from mmserve.engine.runner import ModelRunner, StepLogits
from mmserve.engine.sampler import Sampler, SampleResult, SamplingState, adjusts
from mmserve.engine.scheduler import ScheduledSeq, Scheduler
from mmserve.engine.span_encoder import SpanEncoder, SpanMaterializer
from mmserve.engine.stop import StopChecker
from mmserve.engine.token_output import TokenAppender
from mmserve.errors import InvalidRequestError
from mmserve.kernels.triton_copy import copy_flat
from mmserve.models.base import CausalLM
from mmserve.sampling_params import SamplingParams
from mmserve.speculative.speculator import Speculator
from mmserve.structured.grammar import GrammarCompiler, GrammarLoader

log = logging.getLogger("mmserve")


@dataclass
class _Launched:
    """A plain decode step on its way (async scheduling): its rows are its sequences in
    order, and its tokens are copied to the host while later work runs."""

    seqs: list[ScheduledSeq]
    result: StepLogits
    tokens: torch.Tensor  # (n,) the step's tokens on the device (argmax or drawn; valid
    # until the next replay, which every read of them is queued before)
    host: torch.Tensor | None  # CUDA: pinned (n,), the copy's target
    ready: torch.cuda.Event | None  # CUDA: recorded after the copy (None: not yet queued)
    quiet: bool  # the speculator's quiet flag as it proposed this step (False: none)

    def send(self) -> None:
        """Queue the tokens' copy to the host, unless it is queued already (the step
        launched after this one carries it in its input copy: ``LLMEngine._launch_ahead``)."""
        if self.host is not None and self.ready is None:
            copy_flat(self.host, self.tokens)  # a kernel writes the pinned buffer
            self.ready = torch.cuda.Event()
            self.ready.record()

    def token_ids(self) -> list[int]:
        """The step's tokens on the host; waits for this step's copy only."""
        if self.host is None:
            return self.tokens.tolist()
        self.send()
        assert self.ready is not None
        self.ready.synchronize()
        return self.host.tolist()


@dataclass
class _Prelaunched:
    """A step launched once the last step's tokens were in, before that step's text and
    outputs were built (async scheduling): the step the synchronous engine takes next,
    proposed and scheduled from the same state, launched a little earlier."""

    seqs: list[ScheduledSeq]
    result: StepLogits
    quiet: bool


def audio_policy(config: EngineConfig, max_num_seqs: int) -> AudioPolicy:
    """The scheduler's audio policy as ``config`` sets it."""
    return AudioPolicy(config.audio_scheduling, config.audio_window or max_num_seqs,
                       config.audio_lead_s, config.audio_queue_s)


def _picked_on_device(req: Request, ahead: int) -> bool:
    """No logprobs, and nothing for the sampler to apply ``ahead`` tokens from now
    (penalties, min_tokens): the request's next token can be picked on the device, the
    argmax (greedy) or a draw from its own generator (sampled), without the host."""
    return req.params.logprobs is None and not adjusts(req.sampling, [0] * ahead)


class LLMEngine:
    def __init__(self, config: EngineConfig, model: CausalLM, tokenizer, max_model_len: int,
                 device: torch.device, dtype: torch.dtype,
                 spec: Speculator | None = None,
                 span_encoder: SpanEncoder | None = None) -> None:
        bs = config.block_size
        kv_dtype = kv_cache_dtype(config.kv_cache_dtype, dtype)
        per_token = KVCache.bytes_per_block(model.num_layers, 1, model.num_kv_heads,
                                            model.head_dim, kv_dtype)
        # unset sizes (max_num_seqs, step budget, KV memory) from the device and the model
        config, self.sizes = resolve_sizes(config, device, per_token, max_model_len)
        self.config, self.model, self.tokenizer = config, model, tokenizer
        self.max_model_len, self.device, self.dtype = max_model_len, device, dtype
        self.connector: Any = None  # a vision connector, when one is served (factory)
        if config.num_kv_blocks is not None:
            self.kv = KVCache(model.num_layers, config.num_kv_blocks, bs, model.num_kv_heads,
                              model.head_dim, kv_dtype, device)
        else:
            self.kv = KVCache.from_budget(self.sizes.kv_cache_memory_mb << 20, model.num_layers, bs,
                                          model.num_kv_heads, model.head_dim, kv_dtype, device)
        capacity = self.kv.num_blocks * bs
        if capacity < max_model_len:  # one sequence must always fit alone
            self.max_model_len = capacity
        self.blocks = BlockManager(self.kv.num_blocks, bs, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, self.sizes.max_num_seqs,
                                   self.sizes.max_num_batched_tokens, config.max_waiting,
                                   config.prefill_chunk_tokens,
                                   audio_policy(config, self.sizes.max_num_seqs))
        graphs = self._capture_graphs(model, device)
        self.runner = ModelRunner(model, self.kv, bs, *(graphs or (None, None)))
        self.sampler = Sampler()
        self.appender = TokenAppender(tokenizer)
        self.spec = spec
        self._spec_off: Speculator | None = None  # the speculator while switched off
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
        # async scheduling: on CUDA only (on CPU a step launched ahead runs at once, so
        # there is nothing to overlap; tests switch it on there to check its bookkeeping)
        self.async_scheduling = config.async_scheduling and device.type == "cuda"
        # the step launched before the last one finished (its tokens on the device), or
        # once the last one's tokens were in, before its outputs
        self._ahead: _Launched | _Prelaunched | None = None
        # a step launched in an earlier call is timed from that call's cost record on
        # (one step's whole period, like a synchronous step's); the last step's deferred
        # text work falls in it
        self._recorded_at = 0.0
        self._carried_emit = 0.0
        self._ran_nothing = False  # the last step scheduled nothing (``idle_for``)
        self.ahead_steps = 0  # steps launched ahead (tests, benchmarks)
        self.prelaunched_steps = 0  # steps launched before the last step's outputs
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    def _capture_graphs(self, model: CausalLM, device: torch.device
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
        log.info("captured CUDA graphs for decode batch sizes %s in %.2fs using %.0f MiB",
                 report.batch_sizes, report.seconds, report.pool_bytes / 2**20)
        self.graph_report = report
        chunk = min(self.sizes.max_num_batched_tokens, self.max_model_len)
        lengths = tuple(q for q in PREFILL_SIZES if q < chunk) + (chunk,)
        prefill = DecodeGraphs(model, self.kv, blocks, (1,), lengths, last_row_only=True)
        report = prefill.capture()
        log.info("captured CUDA graphs for batch-1 prefill chunks of %s tokens in %.2fs "
                 "using %.0f MiB", lengths, report.seconds, report.pool_bytes / 2**20)
        return graphs, prefill

    def set_span_encoder(self, encoder: SpanEncoder) -> None:
        """Register what computes pending embedding spans (a vision connector, say), with
        an encoder-output cache of ``EngineConfig.encoder_cache_mb``."""
        hidden = self.model.embed_tokens.embedding_dim
        if encoder.hidden_size != hidden:
            raise ValueError(f"the span encoder gives {encoder.hidden_size}-dim vectors; the "
                             f"model embeds tokens in {hidden} dims")
        self.spans = SpanMaterializer(encoder, self.config.encoder_cache_mb << 20)

    # -- requests --------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    request_id: str | None = None,
                    spans: list[EmbeddingSpan] | None = None,
                    audio: AudioSpec | None = None) -> str:
        """Queue a request; raises InvalidRequestError / QueueFullError without side effects."""
        request_id = request_id or f"req-{next(self._ids)}"
        self._validate(prompt_ids, params, request_id, spans or [])
        grammar = self.grammars.state(params.structured) if params.structured else None
        limit = len(prompt_ids) + (params.max_tokens or self.max_model_len)
        req = Request(
            request_id, list(prompt_ids), params,
            SamplingState.create(params, self.tokenizer.eos_token_ids, self.device, grammar),
            IncrementalDetokenizer(self.tokenizer.backend, prompt_ids, params.skip_special_tokens,
                                   getattr(self.tokenizer, "all_special_ids", None)),
            StopChecker(params.stop, params.include_stop_str_in_output),
            set(self.tokenizer.eos_token_ids), min(limit, self.max_model_len), list(spans or []),
            audio)
        self.scheduler.add(req)
        if audio is not None:
            self.scheduler.policy.attach(req)
        self.requests[request_id] = req
        self.prompt_tokens_total += len(prompt_ids)
        return request_id

    def _validate(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                  spans: list[EmbeddingSpan]) -> None:
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
                f"{self.max_model_len - 1}")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise InvalidRequestError(f"logit_bias token ids must be in [0, {vocab})")
        for sp in spans:
            if sp.pending and self.spans is None:
                raise InvalidRequestError(
                    "this request carries image (or other encoded) input, but the engine has "
                    "no encoder for it; serve with a connector")
            if sp.pending and (sp.payload is None or not sp.source or not sp.digest):
                raise InvalidRequestError("a pending embedding span needs a payload, its "
                                          "source digest and a prefix-cache digest")
            ready = sp.pending or (sp.vectors is not None and sp.vectors.dim() == 2)
            if not ready or sp.length < 1 or sp.start < 0 or sp.end > len(prompt_ids):
                raise InvalidRequestError(
                    f"embedding span at {sp.start} of {sp.length} vectors does not fit "
                    f"a prompt of {len(prompt_ids)} tokens")

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.pop(request_id, None)
        if req is None or req.finished:
            return None
        self.scheduler.finish(req)
        self.scheduler.policy.detach(req, aborted=True)
        if self.spec is not None:
            self.spec.forget(request_id)
        req.finish_reason = "abort"
        return req.take_output()

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
    def speculator(self) -> Speculator | None:
        """The engine's speculator, switched on or off (None: built without one)."""
        return self.spec or self._spec_off

    # -- the step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        self._ran_nothing = False
        launched, self._ahead = self._ahead, None
        if launched is not None and all(s.req.finished for s in launched.seqs):
            launched = None  # every request of the step ahead finished (or was aborted)
        carried, self._carried_emit = self._carried_emit, 0.0
        if launched is not None:  # launched in the last call: timed from its cost record
            seqs, result, quiet = launched.seqs, launched.result, launched.quiet
            start = self._recorded_at
        else:
            step = self._propose_and_run()
            if step is None:
                self._ran_nothing = True
                self.scheduler.policy.idle()
                return self._refused()
            seqs, result, quiet = step
            carried = 0.0
        if not isinstance(launched, _Launched):
            launched = self._launched(seqs, result, quiet) if self._overlaps(seqs) else None
        if launched is not None:
            self._ahead = self._launch_ahead(launched)
            ids = launched.token_ids()  # copied by the step ahead's input launch, or now
            sampled: SampleResult | None = SampleResult(ids, [None] * len(ids))
            picks: list[slice | None] = [slice(i, i + 1) for i in range(len(ids))]
        else:
            sampled, picks = self._sample(seqs, result)
        now = time.monotonic()
        emit_s, emitted, emitters = 0.0, 0, 0  # per-token work: detokenizing, stop checks
        done: list[Request] = []  # requests with outputs, in order
        for s, rows, pick in zip(seqs, result.rows, picks, strict=True):
            req = s.req
            if req.finished:  # a step run ahead: its request finished (or was aborted)
                continue
            if not rows:  # a prefill chunk that has not reached the end of the prompt
                req.num_computed = s.start + s.num_tokens
                self._commit(req)
                continue
            if s.draft:
                assert self.spec is not None
                if pick is not None:  # greedy: the target's tokens came from the batch call
                    tokens = self.spec.verify_greedy(s, sampled.token_ids[pick])  # type: ignore[union-attr]
                else:
                    tokens = self.spec.verify(s, result.logits[rows], self.sampler)
                logprobs: list = [None] * len(tokens)
            else:
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
                req, tokens, logprobs, defer_text=self.async_scheduling and not req.stop)
            emit_s += time.perf_counter() - t
            emitted, emitters = emitted + len(tokens), emitters + 1
            if req.finished:
                self._finish(req)
            done.append(req)
        # per-token work counted as one token per sequence, what a plain step emits: a
        # token costs it whichever step emits it, so it is no price of verifying (on the
        # H200 a 3-token verify step measured 25 % dearer than a decode step with it)
        share = 1.0 - emitters / emitted if emitted > emitters else 0.0
        if self.spec is not None:  # the whole step: on CUDA the forward alone is asynchronous
            seconds = time.perf_counter() - start - emit_s * share - carried
            self.spec.record_step(result.num_rows, seconds, any(s.draft for s in seqs),
                                  result.graph, emitted, emitters, quiet)
        self._recorded_at = time.perf_counter()
        if self._ahead is None and self.async_scheduling and self.scheduler.has_work():
            # the next step's tokens are all in: launch it before this step's text and
            # outputs are built (the same step the synchronous engine takes next)
            self._ahead = self._prelaunch()
        t = time.perf_counter()
        for req in done:
            self.appender.catch_up(req)
        if self._ahead is not None:  # that text work falls in the next step's time
            self._carried_emit = (time.perf_counter() - t) * share
        policy = self.scheduler.policy
        policy.end_step(len(seqs), sum(s.num_tokens for s in seqs), self.scheduler.has_work())
        return [req.take_output() for req in done if policy.releases(req)] + self._refused()

    def _refused(self) -> list[RequestOutput]:
        """Outputs for the waiting audio streams the audio policy refused this step."""
        outs = []
        for req in self.scheduler.refused:
            self._finish(req)
            req.finish_reason = "overloaded"
            outs.append(req.take_output())
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

    def _propose_and_run(self) -> tuple[list[ScheduledSeq], StepLogits, bool] | None:
        """Draft, schedule and launch a step -> (its sequences, logits, the speculator's
        quiet flag), or None: nothing to run."""
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
        return seqs, self.runner.run(seqs), quiet

    def _grammar_drafts(self, drafts: dict[str, list[int]]) -> dict[str, list[int]]:
        """Drafts cut at the first token a constrained request's grammar refuses (a token
        the target could never pick after the mask: verifying it would be wasted rows)."""
        out = {}
        for request_id, draft in drafts.items():
            req = self.requests.get(request_id)
            grammar = req.sampling.grammar if req is not None else None
            if grammar is not None:
                draft = draft[:grammar.valid_prefix(draft)]
                if not draft and self.spec is not None:  # as a drafter that found nothing
                    self.spec.controller.no_draft(request_id)
            if draft:
                out[request_id] = draft
        return out

    def _prelaunch(self) -> _Prelaunched | None:
        step = self._propose_and_run()
        if step is None:
            return None
        self.prelaunched_steps += 1
        return _Prelaunched(*step)

    # -- async scheduling ------------------------------------------------------------
    def _overlaps(self, seqs: list[ScheduledSeq]) -> bool:
        """Whether this step's tokens can wait on the device while the next step launches:
        a plain decode of one token a sequence, every request picked on the device
        (greedy or sampled) with nothing the sampler applies (penalties, min_tokens) and
        no logprobs, now and one token on (those need the host's counts or this step's
        logits, which the next step's replay overwrites)."""
        if not self.async_scheduling:
            return False
        for s in seqs:
            if s.draft or s.num_real != 1 or not s.samples or not _picked_on_device(s.req, 0):
                return False
        return True

    def _launched(self, seqs: list[ScheduledSeq], result: StepLogits,
                  quiet: bool) -> _Launched:
        """The step's tokens picked on the device (a graph's argmax buffer is read in
        place: the next replay overwrites it only after every read queued here), on CUDA
        with a pinned buffer for their way to the host (``_Launched.send``: the step
        launched ahead copies them there in its own input copy's launch, one launch
        fewer a step; H200, SmolLM2-135M batch 1, ~-2.4 us of ~568, session 32). Sampled
        rows are drawn now, before any later step's draw from the same generators. (The
        host's counts may lack the last step's token here, for a step launched ahead;
        nothing a draw reads depends on them: a request overlaps only with no penalty
        and with its min_tokens behind it.)"""
        n = len(seqs)
        assert result.rows[-1] == [n - 1] and len(result.rows) == n, "one row a sequence"
        # the sampler's own pick: the graph's argmax when all are greedy (a view of its
        # buffer: every read of it, the copy to the host and the next step's input ids,
        # is queued before the next replay overwrites it), else a draw, device work that
        # waits for nothing
        argmax = result.argmax[:n] if result.argmax is not None else None
        tokens = self.sampler.sample_tokens(result.logits[:n], [s.req.sampling for s in seqs],
                                            argmax=argmax)
        if tokens.device.type != "cuda":
            return _Launched(seqs, result, tokens, None, None, quiet)
        host = torch.empty(n, dtype=tokens.dtype, pin_memory=True)
        return _Launched(seqs, result, tokens.contiguous(), host, None, quiet)

    def _launch_ahead(self, cur: _Launched) -> _Launched | None:
        """Launch the step after ``cur`` before ``cur``'s tokens are on the host, when it
        is known without them: every running request decodes its next token, all keep
        overlapping, none waiting could be admitted (every slot is taken, and none frees
        by length), their slots fit without preempting anyone, and speculation (if on)
        would draft nothing. (A request that ends at an EOS or a stop string frees its
        slot a step later than it would have: the one step ahead its row ran in.)"""
        running, waiting = self.scheduler.running, len(self.scheduler.waiting)
        if not self.scheduler.policy.steady():
            return None
        if (waiting and len(running) < self.scheduler.max_num_seqs) or len(running) != len(
                cur.seqs) or any(s.req is not r for s, r in zip(cur.seqs, running, strict=True)):
            return None
        # each row: its sequence, its table, where cur's row of it is; the blocks the slot
        # of the token it writes needs (taken from the free pool alone: a row may still end
        # at EOS, and the synchronous engine would never have taken, or evicted a cached
        # prefix for, its block; short of it the scheduler decides, and may preempt)
        ahead: list[tuple[ScheduledSeq, BlockTable, int]] = []
        fresh = 0
        for i, s in enumerate(cur.seqs):
            req, p, table = s.req, s.req.params, s.req.table
            assert table is not None
            if not _picked_on_device(req, 1):
                return None
            if (p.max_tokens is not None and len(req.output_ids) + 1 >= p.max_tokens) or (
                    req.num_tokens + 1 >= req.max_total_len):
                continue  # cur's token is its last
            ahead.append((ScheduledSeq(req, s.start + 1, 1), table, i))
            fresh += max(0, self.blocks.blocks_for(s.start + 2) - len(table.block_ids))
        if not ahead or (len(ahead) < len(cur.seqs) and (waiting or self.spec is not None)):
            return None  # a slot frees for a waiting request; for speculation a new shape
        # (returning None: ``step`` queues cur's copy to the host itself)
        if fresh > self.blocks.num_fresh_blocks:
            return None
        if self.spec is not None and not self.spec.propose_ahead(running, waiting):
            return None
        for a, table, _ in ahead:
            extra = a.start + 1 - table.num_tokens
            if extra > 0:
                reserved = self.blocks.append_slots(table, extra)
                assert reserved  # the free pool held them
        seqs = [a for a, _, _ in ahead]
        whole = len(ahead) == len(cur.seqs)
        keep = cur.tokens if whole else cur.tokens[
            torch.tensor([i for _, _, i in ahead], device=cur.tokens.device)]
        # every row goes on: its input ids are cur's tokens, and the launch that copies
        # them in also copies them to the host (else cur's own copy goes first, so the
        # host never waits behind the step ahead)
        carry = None
        if whole and cur.host is not None and cur.ready is None:
            carry = (cur.host, torch.cuda.Event())
        else:
            cur.send()
        result = self.runner.run_ahead(seqs, keep, tokens_to=carry)
        if carry is not None:
            cur.ready = carry[1]
        self.ahead_steps += 1
        return self._launched(seqs, result, self.spec is not None and self.spec.quiet)

    def _sample(self, seqs: list[ScheduledSeq], result: StepLogits
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
        pick: slice | list[int] = (slice(rows[0], rows[-1] + 1)
                                   if rows[-1] - rows[0] + 1 == len(rows) else rows)
        argmax = result.argmax[pick] if result.argmax is not None else None
        return self.sampler.sample(result.logits[pick], states, extra, argmax), picks

    def _commit(self, req: Request) -> None:
        """Offer the newly full blocks of computed tokens to the prefix cache."""
        table, bs = req.table, self.config.block_size
        assert table is not None
        if (not self.blocks.enable_prefix_caching
                or req.num_computed // bs <= len(table.block_hashes)):
            return  # no block filled up this step (most steps): skip copying the context
        self.blocks.commit_full_blocks(table, req.all_ids[: req.num_computed],
                                       req.extra_keys(bs))

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
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            preemptions_total=self.scheduler.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            prefix_cache_hit_tokens_total=self.blocks.prefix_hits,
            prefix_cache_query_tokens_total=self.blocks.prefix_queries,
            **self.scheduler.policy.stats(), **self._encoder_stats(), **self._spec_stats())

    def _encoder_stats(self) -> dict:
        if self.spans is None:
            return {}
        st = self.spans.stats
        return {"encoder_calls_total": st.encoder_calls,
                "encoder_payloads_total": st.encoded_payloads,
                "encoder_cache_hits_total": st.cache_hits}

    def _spec_stats(self) -> dict:
        spec = self.speculator
        if spec is None:
            return {}
        totals = spec.controller.totals()
        return {"spec_guard_pauses_total": spec.controller.pauses,
                "spec_num_drafts_total": totals.num_drafts,
                "spec_draft_tokens_total": totals.num_draft_tokens,
                "spec_accepted_tokens_total": totals.num_accepted_tokens,
                "spec_acceptance_by_position": spec.controller.acceptance_by_position()}


__all__ = ["LLMEngine", "Status", "ScheduledSeq"]
