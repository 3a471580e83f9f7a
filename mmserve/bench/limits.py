"""Physical limits measured in the benchmark's own run: copy bandwidth, and the timer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def cuda_time_ms(fn: Callable[[], object], repeats: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` on the current stream, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 2 << 30) -> dict:
    """Device-to-device copy of ``nbytes``, counting bytes read plus written (GB/s)."""
    pair = [torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)]
    pair.append(torch.empty_like(pair[0]))
    ms = [cuda_time_ms(lambda: pair[1].copy_(pair[0])) for _ in range(2)]  # twice: the noise
    pair.clear()
    torch.cuda.empty_cache()
    return {"bytes": nbytes, "ms": ms, "gb_s": [2 * nbytes / (m * 1e-3) / 1e9 for m in ms]}


def graph_replay_seconds(fn: Callable[[], object], reps: int = 5) -> float:
    """Seconds per replay of a CUDA graph of ``fn()`` (run once first, outside the capture,
    so Triton compiles there; the first replay, which uploads the graph, is not timed)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps
