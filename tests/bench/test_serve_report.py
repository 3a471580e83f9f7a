"""``mmserve bench serve``'s statistics and report, on hand-made timings (no server)."""

from __future__ import annotations

import json

import pytest

from mmserve.bench import serve_report
from mmserve.bench.serve import ServeBenchConfig, prompts
from mmserve.bench.serve_clients import Load, ShareResult, Timing, split


def test_percentile_interpolates_linearly():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert serve_report.percentile(xs, 0) == 1.0
    assert serve_report.percentile(xs, 100) == 4.0
    assert serve_report.percentile(xs, 50) == pytest.approx(2.5)
    assert serve_report.percentile(xs, 99) == pytest.approx(3.97)
    assert serve_report.percentile([7.0], 99) == 7.0
    assert serve_report.percentile([], 50) is None


def test_summarize_counts_completed_tokens_over_the_load_span():
    ok1 = Timing(10.0, ttft=0.1, end=11.0, tokens=16, gaps=[0.05, 0.07])
    ok2 = Timing(10.5, ttft=0.3, end=12.0, tokens=16, gaps=[0.02])
    bad = Timing(10.2, end=10.4, error="boom")
    shares = [
        ShareResult([ok1, bad], cpu_s=0.5, wall_s=2.0),
        ShareResult([ok2], cpu_s=1.5, wall_s=2.0),
    ]
    lv = serve_report.summarize([ok1, bad, ok2], 3, shares)
    assert lv["requests"] == 3 and lv["errors"] == 1 and lv["first_error"] == "boom"
    assert lv["tokens"] == 32 and lv["seconds"] == 2.0 and lv["tok_s"] == 16.0
    assert lv["ttft_p50_ms"] == pytest.approx(200.0)
    assert lv["ttft_max_ms"] == pytest.approx(300.0)
    assert lv["gap_p50_ms"] == pytest.approx(50.0)
    assert lv["text_events_per_request"] == 2.5  # (3 + 2) arrivals over 2 requests
    assert lv["client_procs"] == 2 and lv["client_cpu_util_max"] == 0.75
    json.dumps(lv)  # JSON-able as it stands


def test_summarize_of_nothing_has_no_rates():
    lv = serve_report.summarize([], 4)
    assert lv["tok_s"] is None and lv["ttft_p99_ms"] is None and lv["requests"] == 0


def _result() -> dict:
    def level(tok_s, ttft):
        return {
            "clients": 1,
            "requests": 2,
            "errors": 0,
            "tok_s": tok_s,
            "ttft_p50_ms": ttft,
            "ttft_p99_ms": ttft and 2 * ttft,
            "gap_p99_ms": 5.0,
        }

    return {
        "config": {"max_tokens": 16},
        "machine": {"device": "cpu (2 cores)"},
        "model": "m",
        "server": {"startup_s": 3.0},
        "engine": {"1": level(100.0, 10.0), "4": level(300.0, 20.0)},
        "sse": {"1": level(80.0, 12.0), "4": level(150.0, 30.0)},
        "ws": {"1": level(90.0, 11.0), "4": level(None, None)},
        "first_burst": level(100.0, 40.0),
        "steady_burst": level(100.0, 20.0),
    }


def test_ratios_and_table():
    result = _result()
    serve_report.ratios(result)
    assert result["sse"]["1"]["vs_engine"] == 0.8
    assert result["sse"]["4"]["vs_engine"] == 0.5
    assert "vs_engine" not in result["ws"]["4"]  # no rate, no ratio
    assert result["first_vs_steady"] == {"ttft_p50_ms": 2.0, "ttft_p99_ms": 2.0}
    text = serve_report.table(result)
    assert "sse" in text and "ws" in text and "first/steady TTFT: p50 2.0x" in text
    assert len(text.splitlines()) == 2 + 6 + 3  # header, six loads, bursts and their ratio


def test_report_main_writes_the_png_beside_the_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(_result()))
    assert serve_report.main([str(path)]) == 0
    assert (tmp_path / "serve.png").stat().st_size > 0
    assert "engine" in capsys.readouterr().out


def test_split_and_config():
    assert split(10, 3) == [4, 3, 3] and sum(split(5, 8)) == 5
    assert len(prompts(64)) == 64 and len({json.dumps(p) for p in prompts(64)}) == 64
    cfg = ServeBenchConfig(
        device="cpu", concurrency=(1, 300), burst=32, serve_args=("--max-num-seqs", "8")
    )
    flags = cfg.serve_flags()
    assert flags[flags.index("--max-waiting") + 1] == "600"  # every client fits the queue
    assert flags[-2:] == ["--max-num-seqs", "8"]  # the caller's flags come last and win
    with pytest.raises(ValueError, match="protocol"):
        ServeBenchConfig(protocols=("grpc",))
    with pytest.raises(ValueError, match="concurrency"):
        ServeBenchConfig(concurrency=(0,))
    assert Load("u", "m", "sse", 1, 1, prompts(2), 4).start_at == 0.0


class _RecordingPool:
    """Stands in for the client processes: records each share instead of running it."""

    def __init__(self) -> None:
        self.shares: list[Load] = []

    def map(self, fn, shares):
        self.shares = list(shares)
        return [ShareResult([], 0.0, 1.0) for _ in self.shares]


def test_run_load_splits_clients_requests_and_prompts():
    from mmserve.bench.serve_clients import run_load

    pool = _RecordingPool()
    sets = prompts(8)
    out = run_load(Load("u", "m", "sse", 5, 11, sets, 4), pool, 2)  # type: ignore[arg-type]
    assert len(out) == 2
    a, b = pool.shares
    # 11 requests over 5 clients: 3, 2, 2, 2, 2, so the 3-client share sends 7
    assert (a.clients, b.clients) == (3, 2) and (a.requests, b.requests) == (7, 4)
    assert a.prompts == sets and b.prompts[0] == sets[7]  # b goes on where a's requests end
    run_load(Load("u", "m", "sse", 256, 512, sets, 4), pool, 11)  # type: ignore[arg-type]
    assert all(s.requests == 2 * s.clients for s in pool.shares)  # no client runs a third
    assert a.start_at == b.start_at > 0  # both shares begin at one moment


def test_warm_client_runs_the_sdk_path_against_a_canned_answer():
    """The client processes' warm-up: the openai SDK streams the canned answer (content
    chunks, usage, [DONE]) through the bench's own request code, with no server."""
    pytest.importorskip("openai")
    from mmserve.bench.serve_clients import warm_client

    warm_client()  # asserts the canned stream came back whole, with its usage
    warm_client()  # and again in the same process (a fresh loop, a fresh port)


def test_engine_counters_read_from_metrics_text_and_differenced():
    """The bench reads the step loop's counters off a real ``/metrics`` rendering and
    reports each load's difference with its mean batch and share of steps ahead."""
    from mmserve.bench.serve import COUNTERS, counters_delta, parse_counters
    from mmserve.engine.outputs import EngineStats
    from mmserve.server.metrics import ServerMetrics

    def stats(steps: int) -> EngineStats:
        return EngineStats(
            kv_blocks_total=8, kv_blocks_used=0, kv_blocks_free=8, num_running=0,
            num_waiting=0, preemptions_total=0, prompt_tokens_total=0,
            generation_tokens_total=0, prefix_cache_hit_tokens_total=0,
            prefix_cache_query_tokens_total=0, spec_draft_tokens_total=3 * steps,
            steps_total=steps, step_seqs_total=40 * steps, prompt_steps_total=steps // 10,
            steps_ahead_total=steps // 2, steps_prelaunched_total=steps // 4,
        )  # fmt: skip

    metrics = ServerMetrics(lambda: stats(100), "m")
    metrics.add_engine(lambda: stats(20), "voice")  # every engine's series are summed
    before = parse_counters(metrics.render().decode())
    assert set(before) == set(COUNTERS)
    assert before["engine_steps"] == 120 and before["spec_draft_tokens"] == 360
    after = dict(before, engine_steps=220, engine_step_seqs=before["engine_step_seqs"] + 3000)
    after["engine_steps_ahead"] += 75
    d = counters_delta(before, after)
    assert d["engine_steps"] == 100 and d["mean_batch"] == 30.0 and d["ahead_share"] == 0.75
    assert d["spec_accepted_tokens"] == 0
    assert counters_delta({}, {}) == {}


def test_client_processes_take_the_cores_the_served_layout_leaves(monkeypatch):
    """On a 16-core GPU host the split server takes three cores (its core one, its four
    API servers half a core each), so thirteen client processes; on a CPU one server
    process; set, as set."""
    from mmserve.bench.serve import ServeBenchConfig

    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert ServeBenchConfig(device="cuda").procs() == 13
    assert ServeBenchConfig(device="cpu").procs() == 15
    assert ServeBenchConfig(device="cuda", client_procs=3).procs() == 3
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert ServeBenchConfig(device="cuda").procs() == 1
