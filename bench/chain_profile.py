"""What each kernel of a batch-1 graph decode step adds to the step's chain (CUDA only).

Under PDL a kernel starts while its predecessor runs and waits for it, so a kernel's own
span (start to end) counts its predecessor's tail too. Here each kernel is charged what
it adds to the chain: ``end_i - max(start_i, end_{i-1})``, and the idle time before it
``max(0, start_i - end_{i-1})`` as a gap; the two sum to the traced span. Kernels are named
by their role in the layer (the GEMM kernels serve several: qkv, o, gate_up, down and
lm_head are told apart by their order in the step), and a GEMM's weight bytes over its
charge is its bandwidth in the chain, beside the copy bandwidth measured in the same run.

Random bf16 weights, a 128-token prompt, the captured batch-1 graph replayed under
``torch.profiler``; the variants are ``bench/pdl_trigger_ab.py``'s (the default first;
session 18's L2-prefetch variants it profiled are in git history up to b1ccbac).

Usage (GPU): PYTHONPATH=$PWD python bench/chain_profile.py OUT.json [shape] [--only a,b]
"""

from __future__ import annotations

import collections
import json
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from pdl_trigger_ab import VARIANTS, use  # noqa: E402

from mmserve.bench.engine_run import batch1_step_baseline  # noqa: E402

STEPS = 10


def roles(names: list[str], per_step: dict[str, int]) -> list[str]:
    """Each kernel's role: a GEMM by where it sits after the last RMSNorm (a layer is
    norm, qkv, ..., o, norm, gate_up, ..., down; the step's last norm is the final one,
    then lm_head), every other kernel by its name."""
    norms = per_step.get("_rms_norm_kernel", 0)
    after = (("qkv", "o"), ("gate_up", "down"), ("lm_head", "lm_head"))
    n_norm, pos, kind = 0, 0, 0
    out = []
    for n in names:
        base = n.split("(")[0]
        if base == "_rms_norm_kernel":
            i = n_norm % norms if norms else n_norm
            kind = 2 if norms and i == norms - 1 else i % 2
            n_norm += 1
            pos = 0
        if "gemm_kernel" in base or base == "_qkv_rope_kernel":  # the latter: qkv + rope
            out.append(after[kind][min(pos, 1)])
            pos += 1
        else:
            out.append(base[:60])
    return out


def chain(events: list[tuple[float, float, str]]) -> dict[str, list[float]]:
    """(start, end, role) in start order -> role: [count, charged us, gap us, span us]."""
    per: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    prev_end = events[0][0]
    for start, end, role in events:
        r = per[role]
        r[0] += 1
        r[1] += max(0.0, end - max(start, prev_end))
        r[2] += max(0.0, start - prev_end)
        r[3] += end - start
        prev_end = max(prev_end, end)
    return per


def profile_step(dec, first: list[int], weights: dict[str, int], copy_gb_s: float) -> dict:
    from torch.profiler import ProfilerActivity, profile

    dec.capture((1,))
    dec.decode(first, 128, 20, graphs=True)  # warm
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dec.decode(first, 128, STEPS, graphs=True, warmup=0)
    raw = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
                 and "memset" not in e.name.lower())
    counts = collections.Counter(n for _, _, n in raw)
    per_step = {n: c // STEPS for n, c in counts.items()}
    print("  kernels a step:", {n.split("(")[0][:40]: c for n, c in per_step.items()}, flush=True)
    names = [n for _, _, n in raw]
    events = [(s, e, r) for (s, e, _), r in zip(raw, roles(names, per_step), strict=True)]
    per = chain(events)
    span = events[-1][1] - events[0][0]
    rows = []
    for role, (c, charged, gap, sp) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        row = {"role": role, "per_step": c / STEPS, "charged_us_step": charged / STEPS,
               "charged_us_each": charged / c, "gap_us_step": gap / STEPS,
               "span_us_each": sp / c}
        if role in weights:
            row["chain_gb_s"] = weights[role] / (charged / c * 1e-6) / 1e9
            row["of_copy"] = row["chain_gb_s"] / copy_gb_s
        rows.append(row)
    return {"span_us_step": span / STEPS, "roles": rows}


def main() -> None:
    out_path = sys.argv[1]
    args = [a for i, a in enumerate(sys.argv[2:], 2)
            if not a.startswith("--") and not sys.argv[i - 1].startswith("--")]
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else []
    name = args[0] if args else "llama3-8b"
    use({})
    dec, first, report = batch1_step_baseline(name)
    layer = dec.model.layers[0]
    weights = {role: w.numel() * w.element_size() for role, w in (
        ("qkv", layer.attn.qkv_weight), ("o", layer.attn.o_weight),
        ("gate_up", layer.mlp.gate_up_weight), ("down", layer.mlp.down_weight),
        ("lm_head", dec.model.lm_head_weight()))}
    report["profiles"] = {}
    for label in ["default", *only]:
        use(VARIANTS[label] if label != "default" else {})
        p = profile_step(dec, first, weights, report["copy_gb_s"])
        report["profiles"][label] = p
        print(f"[{label}] traced span {p['span_us_step']:.0f} us a step", flush=True)
        for r in p["roles"][:14]:
            bw = f"  {r['of_copy'] * 100:5.1f} % of copy" if "of_copy" in r else ""
            print(f"  {r['role']:<28} x{r['per_step']:5.1f} {r['charged_us_step']:8.1f} us "
                  f"({r['charged_us_each']:6.2f} each, gap {r['gap_us_step']:5.1f}, span "
                  f"{r['span_us_each']:6.2f}){bw}", flush=True)
    use({})
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
