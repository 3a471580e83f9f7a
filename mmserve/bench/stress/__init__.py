"""``mmserve bench stress``: hostile and heavy use of a live server, in counts.

Starts ``mmserve serve`` on 127.0.0.1 (a child process, so its RSS is its own), runs
the chosen phases against it (``phases.py``: schema fuzzing over HTTP and the Realtime
WebSocket, an abort storm, 2x overload, slow clients, the long-prefill case, a soak;
prefix-cache eviction on a second server with a small KV pool), prints one row per
phase (inputs tried, crashes, 5xx, leaked blocks, RSS growth) and writes
``stress.json``. Every count and duration is bounded by the options.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mmserve.bench.stress import phases
from mmserve.bench.stress.fuzz_workers import run_fuzz
from mmserve.bench.stress.target import spawn

PHASES = (
    "fuzz-http",
    "fuzz-ws",
    "abort-storm",
    "overload",
    "slow-clients",
    "long-prefill",
    "eviction",
    "soak",
)


@dataclass
class StressConfig:
    only: tuple[str, ...] = PHASES
    device: str = "cpu"
    model: str | None = None
    fuzz_inputs: int = 10_000  # split between HTTP (60 %) and WebSocket (40 %)
    fuzz_give_up_s: float = 5.0  # an HTTP fuzzing client's wait for an answer
    fuzz_workers: int = 8  # fuzzing clients at once, each a process (fuzz_workers.py)
    aborts: int = 1000
    max_num_seqs: int = 8
    max_waiting: int = 16
    overload_rounds: int = 3
    soak_clients: int = 64
    soak_s: float = 1800.0
    seed: int = 0
    out_dir: str = "bench/out"

    def __post_init__(self) -> None:
        if self.fuzz_workers < 1:
            raise ValueError(f"fuzz_workers must be 1 or more, got {self.fuzz_workers}")


def _server_flags(cfg: StressConfig, extra: list[str]) -> list[str]:
    flags = [
        "--device",
        cfg.device,
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        str(cfg.max_num_seqs),
        "--max-waiting",
        str(cfg.max_waiting),
    ]
    return flags + (["--model", cfg.model] if cfg.model else []) + extra


def run_stress(cfg: StressConfig) -> list[phases.PhaseResult]:
    results: list[phases.PhaseResult] = []
    main_phases = [p for p in cfg.only if p != "eviction"]
    if main_phases:
        target = spawn(_server_flags(cfg, []))
        try:
            rss0 = target.rss_mb()
            for name in main_phases:
                results.append(_run_phase(name, target, cfg))
                _print_row(results[-1])
            results.append(
                phases.PhaseResult(
                    "server",
                    crashes=int(not target.alive()),
                    rss_growth_pct=round(100 * (target.rss_mb() - rss0) / rss0, 2),
                    extra={"rss_mb_start": round(rss0, 1), "rss_mb_end": round(target.rss_mb(), 1)},
                )
            )
        finally:
            target.stop()
    if "eviction" in cfg.only:
        small = spawn(_server_flags(cfg, ["--num-kv-blocks", "48"]))
        try:
            results.append(phases.eviction(small, rng_seed=cfg.seed))
        finally:
            small.stop()
    _report(cfg, results)
    return results


def _run_phase(name: str, target: Any, cfg: StressConfig) -> phases.PhaseResult:
    if name in ("fuzz-http", "fuzz-ws"):
        n_http = int(cfg.fuzz_inputs * 0.6)
        n = n_http if name == "fuzz-http" else cfg.fuzz_inputs - n_http
        return run_fuzz(name, target, n, cfg.seed, cfg.fuzz_workers, cfg.fuzz_give_up_s)
    if name == "abort-storm":
        return phases.abort_storm(target, cfg.aborts, rng_seed=cfg.seed)
    if name == "overload":
        return phases.overload(
            target, cfg.max_num_seqs, cfg.max_waiting, rounds=cfg.overload_rounds
        )
    if name == "slow-clients":
        return phases.slow_clients(target)
    if name == "long-prefill":
        return phases.long_prefill(target)
    if name == "soak":
        return phases.soak(target, cfg.soak_clients, cfg.soak_s, rng_seed=cfg.seed)
    raise ValueError(f"unknown phase {name!r}; choose from {', '.join(PHASES)}")


HEADER = f"{'phase':<14}{'inputs':>8}{'crashes':>9}{'5xx':>6}{'leaked':>8}{'rss %':>8}  extra"


def _print_row(r: phases.PhaseResult) -> None:
    rss = "" if r.rss_growth_pct is None else f"{r.rss_growth_pct:.2f}"
    print(
        f"{r.name:<14}{r.inputs:>8}{r.crashes:>9}{r.status_5xx:>6}{r.leaked_blocks:>8}"
        f"{rss:>8}  {json.dumps(r.extra)}",
        flush=True,
    )


def _report(cfg: StressConfig, results: list[phases.PhaseResult]) -> None:
    print(HEADER)
    for r in results:
        _print_row(r)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": platform.platform(),
        "processor": platform.processor(),
        "config": asdict(cfg),
        "phases": [asdict(r) for r in results],
    }
    (out / "stress.json").write_text(json.dumps(doc, indent=2))
