"""Throwaway timing probes (wrong values): which small kernels cost what in the 8B b1 step."""
import json, statistics, sys
from mmserve.bench.engine_run import batch1_step_baseline
from mmserve.kernels import fused
from mmserve.models import layers

orig = {"rms_norm": fused.rms_norm, "rope_write_kv": layers.rope_write_kv,
        "paged_attention": layers.paged_attention}
def use(skip):
    fused.rms_norm = (lambda x, w, eps, offset=0.0: x) if "norm" in skip else orig["rms_norm"]
    layers.rope_write_kv = (lambda q, k, v, *a: q) if "rope" in skip else orig["rope_write_kv"]
    layers.paged_attention = (lambda q, *a: q) if "attn" in skip else orig["paged_attention"]
dec, first, report = batch1_step_baseline("llama3-8b")
out = {}
for skip in (("norm",), ("rope",), ("attn",), ("rope", "attn"), ("norm", "rope", "attn")):
    r, ms = [], []
    for _ in range(3):
        use(skip); v, _ = dec.recaptured_step_ms(first)
        use(()); b, _ = dec.recaptured_step_ms(first)
        r.append(b / v); ms.append((b * 1e3, v * 1e3))
    out["+".join(skip)] = {"ratio": r, "us": ms}
    print(f"  skip {'+'.join(skip):<16} x{statistics.median(r):.4f} us {[(round(a), round(b)) for a, b in ms]}", flush=True)
report["skips"] = out
json.dump(report, open(sys.argv[1], "w"), indent=1)
