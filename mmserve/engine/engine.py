"""The synchronous engine: one ``step()`` = one scheduling decision = one forward.

    schedule = scheduler.schedule(drafts); logits = runner.run(schedule.seqs);
    tokens = sampler/verifier(logits); postprocess(tokens) -> RequestOutputs

The engine knows tokenization only to detokenize outputs and check stop strings;
requests arrive as token ids (plus optional embedding spans).
"""

from __future__ import annotations

import itertools
import time

import torch

from mmserve.config import EngineConfig
from mmserve.engine.block_manager import BlockManager
from mmserve.engine.detokenizer import IncrementalDetokenizer
from mmserve.engine.kv_cache import KVCache
from mmserve.engine.outputs import EngineStats, RequestOutput
from mmserve.engine.request import EmbeddingSpan, Request, Status
from mmserve.engine.runner import ModelRunner
from mmserve.engine.sampler import Sampler, SamplingState
from mmserve.engine.scheduler import ScheduledSeq, Scheduler
from mmserve.engine.stop import StopChecker
from mmserve.engine.token_output import TokenAppender
from mmserve.errors import InvalidRequestError
from mmserve.models.base import CausalLM
from mmserve.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, config: EngineConfig, model: CausalLM, tokenizer, max_model_len: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.config, self.model, self.tokenizer = config, model, tokenizer
        self.max_model_len, self.device = max_model_len, device
        bs = config.block_size
        if config.num_kv_blocks is not None:
            self.kv = KVCache(model.num_layers, config.num_kv_blocks, bs, model.num_kv_heads,
                              model.head_dim, dtype, device)
        else:
            self.kv = KVCache.from_budget(config.kv_cache_memory_mb << 20, model.num_layers, bs,
                                          model.num_kv_heads, model.head_dim, dtype, device)
        capacity = self.kv.num_blocks * bs
        if capacity < max_model_len:  # one sequence must always fit alone
            self.max_model_len = capacity
        self.blocks = BlockManager(self.kv.num_blocks, bs, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs,
                                   config.max_num_batched_tokens, config.max_waiting)
        self.runner = ModelRunner(model, self.kv, bs)
        self.sampler = Sampler()
        self.appender = TokenAppender(tokenizer)
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    # -- requests --------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    request_id: str | None = None,
                    spans: list[EmbeddingSpan] | None = None) -> str:
        """Queue a request; raises InvalidRequestError / QueueFullError without side effects."""
        request_id = request_id or f"req-{next(self._ids)}"
        self._validate(prompt_ids, params, request_id, spans or [])
        limit = len(prompt_ids) + (params.max_tokens or self.max_model_len)
        req = Request(
            request_id, list(prompt_ids), params,
            SamplingState.create(params, self.tokenizer.eos_token_ids, self.device),
            IncrementalDetokenizer(self.tokenizer.backend, prompt_ids, params.skip_special_tokens),
            StopChecker(params.stop, params.include_stop_str_in_output),
            set(self.tokenizer.eos_token_ids), min(limit, self.max_model_len), list(spans or []))
        self.scheduler.add(req)
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
        if len(prompt_ids) + 1 > self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_ids)} tokens; this model's context is "
                f"{self.max_model_len} tokens, so the prompt may have at most "
                f"{self.max_model_len - 1}")
        for sp in spans:
            if sp.start < 0 or sp.end > len(prompt_ids) or sp.vectors.dim() != 2:
                raise InvalidRequestError(
                    f"embedding span at {sp.start} of {sp.vectors.shape[0]} vectors does not fit "
                    f"a prompt of {len(prompt_ids)} tokens")

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.pop(request_id, None)
        if req is None or req.finished:
            return None
        self.scheduler.finish(req)
        req.finish_reason = "abort"
        return req.take_output()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # -- the step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        schedule = self.scheduler.schedule()
        if not schedule.seqs:
            return []
        result = self.runner.run(schedule.seqs)
        sampling = [(s, r) for s, r in zip(schedule.seqs, result.rows, strict=True) if r]
        if sampling:
            rows = [r[0] for _, r in sampling]
            sampled = self.sampler.sample(result.logits[rows], [s.req.sampling for s, _ in sampling])
        outputs = []
        now = time.monotonic()
        k = 0
        for s in schedule.seqs:
            req = s.req
            req.num_computed = s.start + s.num_tokens
            self.blocks.commit_full_blocks(req.table, req.all_ids[: req.num_computed],  # type: ignore[arg-type]
                                           req.extra_keys(self.config.block_size))
            if not s.samples:
                continue
            token, lps = sampled.token_ids[k], sampled.logprobs[k]
            k += 1
            if req.first_token_time is None:
                req.first_token_time = now
            self.appender.append(req, [token], [lps])
            self.generation_tokens_total += 1
            if req.finished:
                self._finish(req)
            outputs.append(req.take_output())
        return outputs

    def _finish(self, req: Request) -> None:
        self.scheduler.finish(req)
        self.requests.pop(req.request_id, None)

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
            prefix_cache_query_tokens_total=self.blocks.prefix_queries)


__all__ = ["LLMEngine", "Status", "ScheduledSeq"]
