"""Prometheus metrics, one ``CollectorRegistry`` per app (no process-global state).

Server-side series (requests by endpoint and status, time to first token,
inter-token latency, request latency) are observed by the routes; engine series
(KV blocks, queue, preemptions, tokens, prefix-cache hits, speculation) are read
from ``engine.stats()`` at scrape time by a custom collector, so they can never
drift from the engine's own counters.

Several API servers on one port (``--api-server-count``) each observe their own
requests, and a scrape reaches whichever one its connection lands on. There the
server-side series are kept in prometheus_client's multiprocess files under one
directory (``shared_dir``; each server's process then holds that one app) and every
scrape sums them over the servers, as vLLM does: a counter never goes down between
scrapes, and one that a dead server counted stays counted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mmserve.engine.outputs import EngineStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
_RTF_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)
_GAP_BUCKETS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

KNOWN_ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/realtime",
    "/health",
    "/metrics",
)


class EngineStatsCollector(Collector):
    """Turns an ``EngineStats`` snapshot into gauges and counters on every scrape."""

    def __init__(self, stats: Callable[[], EngineStats], model: str) -> None:
        self._stats = stats
        self._model = model

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        labels, values = ["model"], [self._model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"mmserve_{name}", doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"mmserve_{name}", doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge("kv_blocks_used", "KV-cache blocks in use", s.kv_blocks_used)
        yield gauge("kv_blocks_free", "KV-cache blocks free", s.kv_blocks_free)
        yield gauge("kv_blocks_total", "KV-cache blocks in the pool", s.kv_blocks_total)
        yield gauge("num_requests_running", "Requests being decoded", s.num_running)
        yield gauge("num_requests_waiting", "Requests in the waiting queue", s.num_waiting)
        yield counter("preemptions", "Requests preempted for KV memory", s.preemptions_total)
        yield counter("prompt_tokens", "Prompt tokens processed", s.prompt_tokens_total)
        yield counter("generation_tokens", "Tokens generated", s.generation_tokens_total)
        yield counter(
            "prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache",
            s.prefix_cache_hit_tokens_total,
        )
        yield counter(
            "prefix_cache_query_tokens",
            "Prompt tokens looked up in the prefix cache",
            s.prefix_cache_query_tokens_total,
        )
        yield counter(
            "spec_draft_tokens", "Tokens drafted by speculation", s.spec_draft_tokens_total
        )
        yield counter(
            "spec_accepted_tokens",
            "Drafted tokens accepted by verification",
            s.spec_accepted_tokens_total,
        )
        yield counter(
            "spec_guard_pauses",
            "Times drafting was paused because verify steps delivered fewer tokens per "
            "second than plain decode steps",
            s.spec_guard_pauses_total,
        )
        yield counter("engine_steps", "Engine steps run", s.steps_total)
        yield counter(
            "engine_step_seqs",
            "Sequences the engine's steps ran (over engine_steps: the mean batch)",
            s.step_seqs_total,
        )
        yield counter(
            "engine_prompt_steps", "Engine steps that ran a prompt chunk", s.prompt_steps_total
        )
        yield counter(
            "engine_steps_ahead",
            "Steps launched before the last step's tokens reached the host",
            s.steps_ahead_total,
        )
        yield counter(
            "engine_ahead_admissions",
            "Requests admitted into a step launched ahead",
            s.ahead_admissions_total,
        )
        yield counter(
            "engine_steps_prelaunched",
            "Steps launched before the last step's outputs were built",
            s.steps_prelaunched_total,
        )
        yield gauge(
            "audio_streams_active",
            "Audio streams the engine holds (playing or queued)",
            s.audio_streams_active,
        )
        yield counter(
            "audio_streams_refused",
            "Audio streams refused by admission control: they could not start "
            "without making a playing stream late",
            s.audio_streams_refused_total,
        )
        yield counter(
            "encoder_calls", "Batched calls of the span (image) encoder", s.encoder_calls_total
        )
        yield counter(
            "encoder_payloads", "Images (or other payloads) encoded", s.encoder_payloads_total
        )
        yield counter(
            "encoder_cache_hits",
            "Images served from the encoder-output cache, not encoded again",
            s.encoder_cache_hits_total,
        )
        mean_len = GaugeMetricFamily(
            "mmserve_spec_mean_accepted_length",
            "Tokens emitted per verify step: 1 + accepted drafts / drafts (1.0 before any draft)",
            labels=["model"],
        )
        mean_len.add_metric(
            [self._model], 1.0 + s.spec_accepted_tokens_total / max(1, s.spec_num_drafts_total)
        )
        yield mean_len
        by_pos = GaugeMetricFamily(
            "mmserve_spec_acceptance_rate_by_position",
            "Acceptance rate of drafted tokens at each draft position (0 = first)",
            labels=["model", "position"],
        )
        for pos, rate in enumerate(s.spec_acceptance_by_position):
            by_pos.add_metric([self._model, str(pos)], rate)
        yield by_pos


class ServerMetrics:
    """All metrics of one app, registered in its own ``CollectorRegistry``."""

    def __init__(
        self, stats: Callable[[], EngineStats], model: str, shared_dir: str | None = None
    ) -> None:
        """``shared_dir``: keep the server-side series in multiprocess files there, summed
        over every process that does the same (module docstring)."""
        self.shared_dir = shared_dir
        if shared_dir is not None:
            _values_in_files(shared_dir)
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "mmserve_requests",
            "HTTP requests and WebSocket sessions by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "mmserve_time_to_first_token_seconds",
            "Time from request arrival to its first token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "mmserve_inter_token_latency_seconds",
            "Time between consecutive tokens of a stream",
            buckets=_ITL_BUCKETS,
            registry=self.registry,
        )
        self.request_latency = Histogram(
            "mmserve_request_latency_seconds",
            "Time from request arrival to its response's end",
            ["endpoint"],
            buckets=_REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.ttfa = Histogram(
            "mmserve_time_to_first_audio_seconds",
            "Time from response.create to the first audio delta sent",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.audio_rtf = Histogram(
            "mmserve_audio_stream_rtf",
            "Real-time factor of a spoken response: time to its last audio over its duration",
            buckets=_RTF_BUCKETS,
            registry=self.registry,
        )
        self.audio_gap = Histogram(
            "mmserve_audio_stream_worst_gap_seconds",
            "Longest silence (underrun) a spoken response's client had, by the client model "
            "(its buffer, then real-time playback)",
            buckets=_GAP_BUCKETS,
            registry=self.registry,
        )
        self.audio_streams = Counter(
            "mmserve_audio_streams",
            "Spoken responses by outcome: played without an underrun, with one, or refused "
            "by the voice engine's admission control",
            ["outcome"],
            registry=self.registry,
        )
        self.engines = [EngineStatsCollector(stats, model)]
        self.registry.register(self.engines[0])

    def add_engine(self, stats: Callable[[], EngineStats], model: str) -> None:
        """Export another engine's series (the voice's), labelled with its model name."""
        self.engines.append(EngineStatsCollector(stats, model))
        self.registry.register(self.engines[-1])

    def observe_audio_stream(self, heard: Any) -> None:
        """One spoken response as its client heard it (a ``playback_client.Playback``)."""
        self.audio_rtf.observe(heard.rtf)
        self.audio_gap.observe(heard.worst_gap_s)
        self.audio_streams.labels(
            outcome="underrun" if heard.worst_gap_s > 0 else "no_underrun"
        ).inc()

    def count_request(self, path: str, status: int) -> None:
        endpoint = path if path in KNOWN_ENDPOINTS else "other"
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def render(self) -> bytes:
        if self.shared_dir is None:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        every_server = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(every_server, path=self.shared_dir)
        for engine in self.engines:  # read from the engine core: the same for every server
            every_server.register(engine)
        return generate_latest(every_server)


def _values_in_files(path: str) -> None:
    """Metric values created from now on in this process live in prometheus_client's
    per-process files under ``path`` (its multiprocess mode, switched on here rather than
    by the environment at import)."""
    from prometheus_client import values

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path  # where each file is created
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()
