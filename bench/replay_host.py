"""The host side of one graph-replayed decode step, piece by piece (GPU).

Random-weight model (SmolLM2-135M shape by default), the engine's ``DecodeGraphs``
for batch sizes 1, 4 and 16 over a 128-token context. For ``--steps`` synchronous
steps (``run_verify``, then ``argmax().tolist()`` as the engine's greedy sampler does)
the host time of each piece of ``run_verify`` is timed with ``perf_counter``: the wait
for the last step's input copy, ``_fill``, the input copy's launch, the event record,
the graph launch (``replay``), the slice of the graph's argmax, and ``tolist`` (which
waits for the GPU). (Session 12's first run timed the code before: a per-sequence
``_fill``, ``current_stream()`` for the record, an argmax launched from the host.) Also:
the kernels one replay runs (torch profiler), and what ``replay()`` costs the host for
a graph of one small kernel (the launch floor).

Usage (GPU): ``PYTHONPATH=$PWD python bench/replay_host.py --out $OUT/replay_host.json``
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import time

import numpy as np
import torch

from mmserve.bench.engine_run import BLOCK_SIZE, PagedDecoder, random_cuda_model


@torch.inference_mode()
def pieces(dec: PagedDecoder, batch: int, steps: int) -> dict:
    g = dec.graphs
    acc: dict = collections.defaultdict(float)
    tokens = [[1] for _ in range(batch)]
    starts = [128] * batch
    tables = dec.tables[:batch]
    for i in range(steps + 20):
        t0 = time.perf_counter()
        bs = g.sizes[bisect.bisect_left(g.sizes, batch)]
        g._copied.synchronize()
        t1 = time.perf_counter()
        keys = g._fill(tokens, starts, tables, BLOCK_SIZE, 1)
        t2 = time.perf_counter()
        view = g._views.get(bs)
        if view is None:
            used = 3 * g._rows + 2 * g.max_batch + bs * g.max_blocks
            view = g._views[bs] = (g._buf[:used], g._host[:used])
        view[0].copy_(view[1], non_blocking=True)
        t3 = time.perf_counter()
        g._copied.record(g._current_stream())
        t4 = time.perf_counter()
        graph, argmax = g.graphs[(bs, 1)], g.argmax[(bs, 1)]
        serial = g.serial.get((bs, 1))
        if serial is not None and keys <= g.serial_max_keys:
            graph, _, argmax = serial
        graph.replay()
        t5 = time.perf_counter()
        am = argmax[:batch]
        t6 = time.perf_counter()
        am.tolist()
        t7 = time.perf_counter()
        if i >= 20:
            for k, a, b in (("sync_copied", t0, t1), ("fill", t1, t2), ("copy_launch", t2, t3),
                            ("record", t3, t4), ("replay_launch", t4, t5),
                            ("argmax_slice", t5, t6), ("tolist_wait", t6, t7),
                            ("step", t0, t7)):
                acc[k] += b - a
    out = {k: round(1e6 * v / steps, 2) for k, v in acc.items()}
    # the GPU alone: replays back to back
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize()
    out["gpu_back_to_back"] = round(1e6 * (time.perf_counter() - t) / steps, 2)
    # what replay() costs the host when the GPU is far behind (launches queue up)
    t = time.perf_counter()
    for _ in range(50):
        graph.replay()
    out["replay_launch_queued"] = round(1e6 * (time.perf_counter() - t) / 50, 2)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    out["kernels_per_replay"] = len(kernels)
    out["kernel_names"] = sorted({e.name[:60] for e in kernels})
    return out


@torch.inference_mode()
def tiny_graph_launch() -> float:
    x = torch.zeros(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(200):
        graph.replay()
        torch.cuda.synchronize()
    return round(1e6 * (time.perf_counter() - t) / 200, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="replay_host.json")
    args = ap.parse_args()
    model, cfg = random_cuda_model(args.model)
    dec = PagedDecoder(model, 16, 512)
    rng = np.random.default_rng(0)
    dec.prefill([rng.integers(0, cfg["vocab_size"], 127).tolist() for _ in range(16)])
    dec.capture((1, 4, 16))
    report = {"tiny_graph_replay_and_sync_us": tiny_graph_launch()}
    for b in (1, 4, 16):
        report[f"b{b}"] = pieces(dec, b, args.steps)
        print(b, json.dumps(report[f"b{b}"]), flush=True)
    print(json.dumps({k: v for k, v in report.items() if not k.startswith("b")}))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
