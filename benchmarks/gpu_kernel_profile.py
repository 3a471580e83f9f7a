"""Where a batch-1 graph decode step's GPU time goes, kernel by kernel (CUDA only).

For each model shape: random bf16 weights, a 128-token prompt, the captured batch-1
decode graph replayed ``STEPS`` times under ``torch.profiler``. Prints, per kernel name,
launches per step, microseconds per step and per launch; the sum of kernel time per
step against the wall time per step (the difference is the gaps between kernels: launch
latency inside the graph, tails, the host); and the weight bytes / kernel time of the
GEMMs (achieved bandwidth), beside the roofline of a copy measured in the same run.

Usage: PYTHONPATH=$PWD python benchmarks/gpu_kernel_profile.py OUT.json [--no-gemm] [shape ...]
(``--shapes-only``: the step profiles alone, e.g. to compare ``MMSERVE_PDL=0`` and 1.)
"""

from __future__ import annotations

import collections
import json
import sys

import torch

from mmserve.bench.engine_run import PagedDecoder, random_cuda_model, weight_bytes
from mmserve.bench.limits import copy_bandwidth, graph_replay_seconds

STEPS = 20


def profile_shape(name: str, bandwidth: float) -> dict:
    model, _ = random_cuda_model(name)
    wbytes = weight_bytes(model)
    dec = PagedDecoder(model, 1, 256)
    dec.capture((1,))
    first = dec.prefill([list(range(1, 129))])
    dec.decode(first, 128, 10, graphs=True)  # warm
    wall = dec.decode(first, 128, 50, graphs=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dec.decode(first, 128, STEPS, graphs=True, warmup=0)
    per: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name != "CUDA" or "memcpy" in e.name.lower():
            continue
        per[e.name][0] += 1
        per[e.name][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time
    kernels = sorted(((n, c / STEPS, t / STEPS) for n, (c, t) in per.items()), key=lambda r: -r[2])
    gpu_us = sum(t for _, _, t in kernels)
    step_us = wall.step_ms_p50 * 1e3
    roof_us = wbytes / bandwidth * 1e6
    out = {
        "weight_bytes": wbytes,
        "step_us_p50": step_us,
        "kernel_us_per_step": gpu_us,
        "roofline_us": roof_us,
        "launches_per_step": sum(c for _, c, _ in kernels),
        "kernels": [
            {"name": n[:120], "per_step": c, "us_per_step": round(t, 2), "us_each": round(t / c, 2)}
            for n, c, t in kernels
        ],
    }
    print(
        f"[{name}] step p50 {step_us:.0f} us, kernels {gpu_us:.0f} us, roofline "
        f"{roof_us:.0f} us, launches {out['launches_per_step']:.0f}",
        flush=True,
    )
    for k in out["kernels"][:25]:
        print(
            f"  {k['us_per_step']:8.1f} us  x{k['per_step']:5.1f}  {k['us_each']:7.2f} each"
            f"  {k['name'][:90]}",
            flush=True,
        )
    del dec, model
    torch.cuda.empty_cache()
    return out


def gemm_bandwidth(bandwidth: float) -> list[dict]:
    """Each 8B linear shape at M=1 alone: the invariant GEMM vs cuBLAS, 24 weight copies in
    rotation (over L2), graph-captured so launch gaps count as in a decode step."""
    from mmserve.kernels.triton_matmul import invariant_linear

    rows = []
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)):
        copies = max(2, min(24, int(2e9 // (n * k * 2))))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        res = {"n": n, "k": k}
        for label, fn in (("triton", invariant_linear), ("cublas", torch.nn.functional.linear)):
            us = _graph_us([lambda w=w, fn=fn, x=x: fn(x, w) for w in ws])
            res[label] = {
                "us": round(us, 2),
                "roofline_frac": round(n * k * 2 / bandwidth / (us * 1e-6), 3),
            }
        print(f"  gemm {n}x{k}: {res}", flush=True)
        rows.append(res)
        del ws
        torch.cuda.empty_cache()
    return rows


def _graph_us(fns: list, reps: int = 5) -> float:
    """Microseconds per call of ``fns`` (one graph of all of them, replayed)."""
    return graph_replay_seconds(lambda: [fn() for fn in fns], reps) / len(fns) * 1e6


def main() -> None:
    out_path = sys.argv[1]
    names = sys.argv[2:]
    bw = max(copy_bandwidth()["gb_s"]) * 1e9
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    report: dict = {"copy_bandwidth": bw}
    if "--no-gemm" not in names and "--shapes-only" not in names:
        report["gemm_m1"] = gemm_bandwidth(bw)
    names = [n for n in names if not n.startswith("--")] or ["llama3-8b", "smollm2-135m"]
    for name in names:
        report[name] = profile_shape(name, bw)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
