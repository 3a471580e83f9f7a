"""Batch invariance of matmuls on this GPU, and what the invariant GEMM costs.

1. cuBLAS (F.linear, bf16): does row 0's output change between M=1 and M=2..256?
2. The Triton fixed-tree GEMM: the same check, plus every tile config and launch shape.
3. Time: cuBLAS vs the Triton GEMM at the models' GEMM shapes, by M.
4. A sweep of tile shapes per M (speed only: the bits are the same for all).
5. The Triton decode-attention kernel's time.

Times are per call from CUDA-graph replays of many calls (a decode step is a graph, and
eager timing of a ~10 us kernel measures Python's launch), cycling through enough copies
of the weights that they do not sit in the 60 MB L2.

Usage: PYTHONPATH=$PWD python benchmarks/invariance.py [out.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from mmserve.kernels.triton_matmul import TileConfig, invariant_linear

SHAPES = {  # name: (N, K) of x @ W.T
    "8b.qkv": (6144, 4096),
    "8b.o": (4096, 4096),
    "8b.gate_up": (28672, 4096),
    "8b.down": (4096, 14336),
    "8b.lm_head": (128256, 4096),
    "135m.qkv": (960, 576),
    "135m.gate_up": (3072, 576),
    "135m.down": (576, 1536),
    "135m.lm_head": (49152, 576),
}
TIME_M = (1, 32, 64, 128, 256, 2048)
SWEEP = {
    1: [
        (16, 16, 256, 4, 4),
        (16, 16, 128, 4, 6),
        (16, 16, 512, 4, 3),
        (16, 32, 256, 4, 4),
        (16, 32, 128, 4, 5),
        (16, 64, 128, 4, 4),
        (16, 16, 256, 2, 4),
        (16, 16, 64, 4, 8),
    ],
    64: [(64, 32, 128, 4, 4), (64, 16, 256, 4, 4), (64, 64, 64, 4, 4), (64, 64, 128, 4, 3)],
    128: [(128, 64, 64, 8, 4), (64, 64, 128, 4, 4), (128, 32, 128, 8, 4), (64, 128, 64, 4, 4)],
    2048: [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (256, 128, 64, 8, 3)],
}


def graph_us(fn, copies: int) -> float:
    """Per-call microseconds of ``fn(i)`` replayed in a CUDA graph, i cycling weight copies."""
    calls = max(24, copies)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(0)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % copies)
    return do_bench(graph.replay, return_mode="median") * 1e3 / calls


def weights(n: int, k: int) -> list[torch.Tensor]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    return [w] + [w.clone() for _ in range(max(0, min(23, -(-(256 << 20) // w.nbytes)) - 1))]


def row0_changes(fn, n: int, k: int, max_m: int = 256) -> list[int]:
    torch.manual_seed(n + k)
    x = torch.randn(max_m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    base = fn(x[:1], w)[0]
    return [m for m in range(2, max_m + 1) if not torch.equal(fn(x[:m], w)[0], base)]


def triton_configs_agree(n: int, k: int) -> dict:
    x = torch.randn(96, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    base = invariant_linear(x[:1], w)[0]
    cfgs = {tuple(c) for cs in SWEEP.values() for c in cs}
    return {
        str(c): torch.equal(invariant_linear(x, w, config=TileConfig(*c))[0], base)
        for c in sorted(cfgs)
    }


def time_gemms() -> dict:
    rows = {}
    for name, (n, k) in SHAPES.items():
        ws = weights(n, k)
        for m in TIME_M:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            cub = graph_us(lambda i, x=x, ws=ws: F.linear(x, ws[i]), len(ws))
            tri = graph_us(lambda i, x=x, ws=ws: invariant_linear(x, ws[i]), len(ws))
            rows[f"{name} M={m}"] = {
                "cublas_us": cub,
                "triton_us": tri,
                "ratio": tri / cub,
                "triton_gb_s": n * k * 2 / (tri * 1e-6) / 1e9,
                "cublas_gb_s": n * k * 2 / (cub * 1e-6) / 1e9,
            }
        del ws
    return rows


def sweep() -> dict:
    """Total time over the 8B GEMMs (+ the 135M ones at M=1) per tile shape, per M."""
    out: dict = {}
    names = [s for s in SHAPES if s.startswith("8b.") and s != "8b.lm_head"]
    small = ["8b.lm_head", "135m.qkv", "135m.gate_up", "135m.down"]
    for m, cfgs in SWEEP.items():
        for name in names + (small if m == 1 else []):
            n, k = SHAPES[name]
            ws = weights(n, k)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for c in cfgs:
                us = graph_us(
                    lambda i, x=x, ws=ws, c=c: invariant_linear(x, ws[i], config=TileConfig(*c)),
                    len(ws),
                )
                out.setdefault(f"M={m} {name}", {})[str(c)] = us
            del ws
    return out


def best_configs(swept: dict) -> dict[int, list[int]]:
    """Per pick_config bucket: the tile shape with the least total time over the shapes."""
    from mmserve.kernels.triton_matmul import BUCKETS

    best = {}
    for m, cfgs in SWEEP.items():
        rows = [r for key, r in swept.items() if key.startswith(f"M={m} ")]
        total = {c: sum(r[str(c)] for r in rows) for c in cfgs}
        best[next(b for b in BUCKETS if m <= b)] = list(min(total, key=total.get))
    return best


def time_attention() -> dict:
    from mmserve.kernels.triton_attention import PagedMetadata, cuda_paged_attention

    out = {}
    for hkv, g, d in ((8, 4, 128), (3, 3, 64)):
        for b, ctx in ((1, 256), (1, 4096), (64, 256), (64, 2048), (128, 512)):
            page = 16
            per = -(-ctx // page)
            kc = torch.randn(b * per, page, hkv, d, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            tables = torch.randperm(b * per, device="cuda").view(b, per)
            meta = PagedMetadata(
                torch.zeros(b, dtype=torch.long, device="cuda"),
                tables,
                torch.full((b,), ctx, device="cuda"),
                torch.arange(b, device="cuda"),
                torch.ones(b, dtype=torch.long, device="cuda"),
                1,
            )
            q = torch.randn(b, hkv * g, d, device="cuda", dtype=torch.bfloat16)
            nbytes = 2 * b * ctx * hkv * d * 2
            us = graph_us(
                lambda i, q=q, kc=kc, vc=vc, meta=meta, d=d: cuda_paged_attention(
                    q, kc, vc, meta, d**-0.5
                ),
                1,
            )
            out[f"Hkv={hkv} G={g} D={d} B={b} ctx={ctx}"] = {
                "us": us,
                "gb_s": nbytes / (us * 1e-6) / 1e9,
            }
    return out


def main() -> None:
    res: dict = {"gpu": torch.cuda.get_device_name()}
    res["cublas_row0_changes"] = {
        name: row0_changes(lambda x, w: F.linear(x, w), n, k) for name, (n, k) in SHAPES.items()
    }
    res["triton_row0_changes"] = {
        name: row0_changes(invariant_linear, n, k) for name, (n, k) in SHAPES.items()
    }
    res["triton_configs_agree"] = {
        name: triton_configs_agree(*SHAPES[name]) for name in ("8b.o", "8b.down", "135m.down")
    }
    res["gemm_time"] = time_gemms()
    res["sweep"] = sweep()
    res["best_configs"] = best_configs(res["sweep"])
    res["attention_time"] = time_attention()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(res, f, indent=1)
        with open(Path(sys.argv[1]).with_name("gemm_configs.json"), "w") as f:
            json.dump(res["best_configs"], f)
    print("row 0 changes vs M=1 (count of M in 2..256; first few):")
    for name in SHAPES:
        c, t = res["cublas_row0_changes"][name], res["triton_row0_changes"][name]
        print(f"  {name:<14} cuBLAS {len(c):>3} {c[:6]}   triton {len(t):>3} {t[:6]}")
    for name, agree in res["triton_configs_agree"].items():
        print(
            f"  triton configs agree with M=1 on {name}: {sum(agree.values())}/{len(agree)}"
            f" {[k for k, v in agree.items() if not v]}"
        )
    print("GEMM time (us, graph replay): cuBLAS vs triton-invariant")
    for key, r in res["gemm_time"].items():
        print(
            f"  {key:<24} {r['cublas_us']:9.1f} {r['triton_us']:9.1f}  x{r['ratio']:.2f}"
            f"  ({r['cublas_gb_s']:6.0f} / {r['triton_gb_s']:6.0f} GB/s weights)"
        )
    print("tile sweep (us per call; best first)")
    for key, r in res["sweep"].items():
        best = sorted(r.items(), key=lambda kv: kv[1])
        print(f"  {key:<18} " + "  ".join(f"{c} {us:.1f}" for c, us in best))
    print(f"best tile shape per row-count bucket: {res['best_configs']}")
    print("decode attention (triton, in a graph; small cases sit in L2)")
    for key, r in res["attention_time"].items():
        print(f"  {key:<34} {r['us']:8.1f} us  {r['gb_s']:6.0f} GB/s KV")


if __name__ == "__main__":
    main()
