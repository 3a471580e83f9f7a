"""Programmatic dependent launch (``kernels.triton_pdl``) on the graph decode step, and where
a batch-1 step's time goes with it on.

Per model shape (random bf16 weights): batch-1 and batch-64 decode tok/s from the captured
graphs with PDL off, on, off, on (alternating, for the machine's drift), the same row-0
tokens required; a torch.profiler timeline of 5 batch-1 steps with PDL on: how many kernels
started before their predecessor ended, and per kernel name the mean time from its start
to the next kernel's start (its share of the step's critical path). For SmolLM2-135M's
widths, chains of 50 dependent launches of one layer op replayed from a graph, PDL off and
on: microseconds a launch.

Usage (GPU): PYTHONPATH=$PWD python bench/pdl_sweep.py OUT.json [shape ...]
"""

from __future__ import annotations

import collections
import json
import sys

import torch

from mmserve.bench.engine_run import PagedDecoder, random_cuda_model, weight_bytes
from mmserve.bench.limits import copy_bandwidth, graph_replay_seconds
from mmserve.kernels.triton_pdl import set_pdl_enabled

SETTINGS = (("off", False), ("pdl", True), ("off_again", False), ("pdl_again", True))


def overlap(dec, first) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dec.decode(first, 128, 5, graphs=True, warmup=0)
    ev = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower())
    early = sum(1 for a, b in zip(ev, ev[1:], strict=False) if b[0] < a[1])
    share: dict = collections.defaultdict(list)
    for a, b in zip(ev, ev[1:], strict=False):
        if b[0] - a[0] < 1000:  # a step's last kernel: its share holds the host's turn
            share[a[2][:60]].append(b[0] - a[0])
    return {"kernels": len(ev), "started_before_predecessor_ended": early,
            "start_to_next_start_us": {k: {"n_per_step": len(v) / 5,
                                           "mean_us": sum(v) / len(v),
                                           "us_per_step": sum(v) / 5}
                                       for k, v in sorted(share.items(),
                                                          key=lambda kv: -sum(kv[1]))}}


def sweep(name: str, bw: float) -> dict:
    model, cfg = random_cuda_model(name)
    dec = PagedDecoder(model, 64, 256)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, cfg["vocab_size"], (64, 128), generator=gen).tolist()
    out: dict = {"roofline_tok_s": bw / weight_bytes(model)}
    for label, pdl in SETTINGS:
        set_pdl_enabled(pdl)
        dec.capture((1, 64))
        row = {}
        for b in (1, 64):
            first = dec.prefill(prompts[:b])
            r = dec.decode(first, 128, 96, graphs=True)
            row[f"b{b}_tok_s"] = r.tok_s
            row[f"b{b}_row0"] = r.row0
        out[label] = row
        print(f"[{name}] {label:10s} b1 {row['b1_tok_s']:8.0f} tok/s "
              f"({row['b1_tok_s'] / out['roofline_tok_s'] * 100:4.1f} % roofline)  "
              f"b64 {row['b64_tok_s']:8.0f}", flush=True)
    out["timeline_pdl"] = overlap(dec, dec.prefill(prompts[:1]))
    t = out["timeline_pdl"]
    print(f"[{name}] {t['started_before_predecessor_ended']}/{t['kernels']} kernels started "
          "before their predecessor ended; start-to-next-start per step:", flush=True)
    for k, v in list(t["start_to_next_start_us"].items())[:8]:
        print(f"    {v['us_per_step']:7.1f} us  x{v['n_per_step']:5.1f}  {v['mean_us']:5.2f} each"
              f"  {k}", flush=True)
    set_pdl_enabled(True)
    ref = out["off"]
    out["same_tokens"] = {k: v["b1_row0"] == ref["b1_row0"] and v["b64_row0"] == ref["b64_row0"]
                          for k, v in out.items() if isinstance(v, dict) and "b1_row0" in v}
    print(f"[{name}] same row-0 tokens as PDL off: {out['same_tokens']}", flush=True)
    for v in out.values():
        if isinstance(v, dict):
            v.pop("b1_row0", None)
            v.pop("b64_row0", None)
    del dec, model
    torch.cuda.empty_cache()
    return out


def _chain_us(make, reps: int = 20) -> dict:
    """``make()`` builds one chain of dependent launches; graph-capture it and time a replay,
    PDL off and on -> microseconds a launch (``make`` returns the launch count)."""
    out = {}
    for pdl in (False, True):
        set_pdl_enabled(pdl)
        launches = make()
        out["pdl" if pdl else "off"] = graph_replay_seconds(make, reps) / launches * 1e6
    set_pdl_enabled(True)
    return out


@torch.inference_mode()
def micro_135m() -> dict:
    """SmolLM2-135M's layer ops, each in a chain of 50 dependent launches (M=1)."""
    from mmserve.kernels import triton_fused as tf
    from mmserve.kernels.triton_attention import PagedMetadata, cuda_paged_attention

    dev, bf = "cuda", torch.bfloat16
    h, inter, hq, hkv, d = 576, 1536, 9, 3, 64

    def w(*s):
        return (torch.randn(*s, device=dev) * s[-1] ** -0.5).to(bf)

    qkv, wo, gu, down, nw = w(960, h), w(h, h), w(2 * inter, h), w(h, inter), w(h) + 1
    x = w(1, h)
    res: dict = {}

    def chain(fn, launches):
        def make():
            y = x
            for _ in range(50):
                y = fn(y)
            return 50 * launches
        return make

    # a layer's four GEMMs in their pairs (x -> qkv -> o + x; x -> silu(gate) * up -> down + x)
    res["qkv_then_o"] = _chain_us(chain(lambda y: tf.linear_residual(
        tf.norm_linear(y, nw, 1e-5, 0.0, qkv)[:, :h], wo, y), 2))
    res["gate_up_then_down"] = _chain_us(chain(lambda y: tf.linear_residual(
        tf.norm_gate_up_silu(y, nw, 1e-5, 0.0, gu), down, y), 2))
    res["o_residual_alone"] = _chain_us(chain(lambda y: tf.linear_residual(y, wo, y), 1))
    for ctx in (128, 512):
        page = 16
        blocks = ctx // page + 1
        kc = torch.randn(blocks, page, hkv, d, device=dev).to(bf)
        vc = torch.randn(blocks, page, hkv, d, device=dev).to(bf)
        meta = PagedMetadata(torch.tensor([ctx - 1], device=dev),
                             torch.arange(blocks, device=dev)[None].int(),
                             torch.tensor([ctx], device=dev), torch.tensor([0], device=dev),
                             torch.tensor([1], device=dev), 1)
        q0 = torch.randn(1, hq, d, device=dev).to(bf)

        def make(meta=meta, kc=kc, vc=vc, q0=q0):
            q = q0
            for _ in range(50):
                q = cuda_paged_attention(q, kc, vc, meta, 0.125)
            return 50
        res[f"attention_ctx{ctx}"] = _chain_us(make)
    for k, v in res.items():
        print(f"  micro {k:20s} off {v['off']:5.2f} us  pdl {v['pdl']:5.2f} us a launch",
              flush=True)
    return res


def main() -> None:
    names = [n for n in sys.argv[2:] if not n.startswith("--")] or ["smollm2-135m", "llama3-8b"]
    bw = max(copy_bandwidth()["gb_s"]) * 1e9
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    report: dict = {"copy_bandwidth": bw}
    if "--no-micro" not in sys.argv:
        report["micro_135m"] = micro_135m()
    report.update({n: sweep(n, bw) for n in names})
    with open(sys.argv[1], "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
