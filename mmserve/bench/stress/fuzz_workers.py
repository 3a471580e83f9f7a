"""The fuzz phases run by several clients at once, each a process of its own.

A hostile client does not wait for the one before it, and one client alone spends most
of a fuzz phase waiting (a fuzzed long generation holds it up to the give-up time, every
Realtime event waits for the answers to drain). ``run_fuzz`` splits a phase's ``n``
inputs into ``workers`` shares that sum to ``n``; worker ``w`` fuzzes its share with seed
``rng_seed + 1000 * w``, so the workers' inputs differ. Workers are processes started
with ``spawn``, not threads: hypothesis is not thread-safe and generating its examples is
CPU-bound. A worker gets the server's address only (a ``Target`` may hold what does not
pickle, such as an in-process engine's ``stats``) and rebuilds a ``Target`` from it.

The counts are summed and the status breakdowns merged; liveness and leaked blocks are
read once, by the parent, after every worker has ended, so nothing is in flight then. A
worker that raises counts as one crash, its error kept in ``extra``; one that dies breaks
the pool, and every worker not finished by then counts as one. The parent interrupted
(Ctrl-C) ends its workers rather than wait for their shares.
One worker runs in this process, as the phase always did.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from mmserve.bench.stress import phases
from mmserve.bench.stress.target import Target

PROGRESS_EVERY = 500  # inputs of a phase between two progress lines on stderr
_SEED_STRIDE = 1000  # worker w fuzzes with rng_seed + 1000 * w

_progress: Any = None  # the phase's shared input counter, set in each worker process


def shares(n: int, workers: int) -> list[int]:
    """``n`` split into ``workers`` shares, the first ``n % workers`` one larger."""
    return [n // workers + (w < n % workers) for w in range(workers)]


def run_fuzz(
    phase: str, target: Target, n: int, rng_seed: int, workers: int, give_up_s: float
) -> phases.PhaseResult:
    """Phase ``phase`` ("fuzz-http" or "fuzz-ws") with ``n`` inputs from ``workers``
    clients, settled (liveness, leaked blocks) once all have ended."""
    assert workers >= 1, workers  # StressConfig checks the user's value
    start = time.monotonic()
    if workers == 1:
        count = [0]

        def tick() -> None:
            count[0] += 1
            _report(phase, count[0], n, start)

        result = _inputs(phase, target, n, rng_seed, give_up_s, tick)
    else:
        result = _pooled(phase, target, n, rng_seed, workers, give_up_s, start)
    return phases.settle(result, target)


def _inputs(
    phase: str,
    target: Target,
    n: int,
    rng_seed: int,
    give_up_s: float,
    tick: Callable[[], None],
) -> phases.PhaseResult:
    if phase == "fuzz-http":
        return phases.fuzz_http_inputs(target, n, rng_seed, give_up_s, tick=tick)
    if phase == "fuzz-ws":
        return phases.fuzz_ws_inputs(target, n, rng_seed, tick=tick)
    raise ValueError(f"unknown fuzz phase {phase!r}; choose fuzz-http or fuzz-ws")


def _pooled(
    phase: str,
    target: Target,
    n: int,
    rng_seed: int,
    workers: int,
    give_up_s: float,
    start: float,
) -> phases.PhaseResult:
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Value("l", 0)
    jobs = [(w, k) for w, k in enumerate(shares(n, workers)) if k]
    pool = ProcessPoolExecutor(
        max_workers=len(jobs),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(counter, phase, n, start),
    )
    try:
        futures = [
            pool.submit(
                _work, phase, target.url, target.pid, k, rng_seed + _SEED_STRIDE * w, give_up_s
            )
            for w, k in jobs
        ]
        return combine(phase, futures)
    except BaseException:
        for child in ctx.active_children():  # the workers: their shares are abandoned
            child.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def combine(phase: str, futures: list[Future[phases.PhaseResult]]) -> phases.PhaseResult:
    """One result from the workers': counts summed, breakdowns merged, failures kept."""
    total = phases.PhaseResult(phase)
    statuses: dict[str, int] = {}
    failures: list[str] = []
    for w, future in enumerate(futures):
        error = future.exception()
        if error is not None:
            total.crashes += 1  # of the harness: the worker's inputs are not counted
            failures.append(f"worker {w}: {type(error).__name__}: {error}")
            continue
        part = future.result()
        total.inputs += part.inputs
        total.crashes += part.crashes
        total.status_5xx += part.status_5xx
        for key, value in part.extra.items():
            if key == "statuses":
                for status, count in value.items():
                    statuses[status] = statuses.get(status, 0) + count
            else:  # fuzz-ws: events_received, sockets_closed_abnormally
                total.extra[key] = total.extra.get(key, 0) + value
    if statuses:
        total.extra["statuses"] = dict(sorted(statuses.items(), key=lambda kv: int(kv[0])))
    total.extra["workers"] = len(futures)
    if failures:
        total.extra["worker_failures"] = failures
    return total


def _init_worker(counter: Any, phase: str, n: int, start: float) -> None:
    global _progress
    _progress = (counter, phase, n, start)


def _work(
    phase: str, url: str, pid: int, n: int, rng_seed: int, give_up_s: float
) -> phases.PhaseResult:
    """One worker's share, in its own process, against the server at ``url``."""
    counter, _, total, start = _progress

    def tick() -> None:
        with counter.get_lock():
            counter.value += 1
            done = counter.value
        _report(phase, done, total, start)

    return _inputs(phase, Target(url, pid), n, rng_seed, give_up_s, tick)


def _report(phase: str, done: int, n: int, start: float) -> None:
    if done % PROGRESS_EVERY == 0:
        elapsed = time.monotonic() - start
        print(f"{phase}: {done}/{n} inputs, {elapsed:.0f} s", file=sys.stderr, flush=True)
