"""``mmserve bench spec``: speculative decoding against plain decode, in the same run.

For every workload and concurrency the same prompts run through two engines on the
same weights, one plain and one speculative; the report gives tok/s of both, the
speed-up, acceptance, and whether the greedy outputs were identical (they must be).
Writes ``spec.json`` and ``spec.png`` (if matplotlib is installed) into ``out_dir``.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from mmserve.bench.spec_workloads import WORKLOADS, workload
from mmserve.llm import LLM
from mmserve.sampling_params import SamplingParams


def _timed(llm: LLM, convs: list, params: SamplingParams) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    out = llm.chat(convs, params)
    return time.perf_counter() - start, [r.token_ids for r in out]


def run_spec_bench(model: str | None = None, speculative_config: dict | None = None,
                   workloads: tuple[str, ...] = WORKLOADS,
                   concurrencies: tuple[int, ...] = (1, 4, 16), max_tokens: int = 96,
                   requests_per_slot: int = 1, repeats: int = 2, device: str = "auto",
                   out_dir: str | Path = "bench/out") -> dict[str, Any]:
    config = speculative_config or {"method": "ngram", "num_speculative_tokens": "auto"}
    plain = LLM(model, device=device, max_num_seqs=max(concurrencies))
    spec = LLM(model, device=device, max_num_seqs=max(concurrencies),
               speculative_config=config)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    _timed(plain, workload("chat", 2), params)  # warm-up: allocator, controller cost model
    _timed(spec, workload("edit", 2) + workload("chat", 2), params)
    rows = []
    for name in workloads:
        for conc in concurrencies:
            convs = workload(name, conc * requests_per_slot)
            for llm in (plain, spec):
                llm.engine.scheduler.max_num_seqs = conc
                llm.chat(convs[:2], SamplingParams(temperature=0, max_tokens=8))  # new shapes
                llm.engine.blocks.reset_prefix_cache()
            before = spec.engine.stats()
            t_plain, t_spec = float("inf"), float("inf")
            for i in range(repeats):  # interleaved, best of each: drift hits both alike
                for llm in ((plain, spec) if i % 2 == 0 else (spec, plain)):  # either first
                    dt, ids = _timed(llm, convs, params)
                    if llm is plain:
                        t_plain, ids_plain = min(t_plain, dt), ids
                    else:
                        t_spec, ids_spec = min(t_spec, dt), ids
                for llm in (plain, spec):
                    llm.engine.blocks.reset_prefix_cache()
            after = spec.engine.stats()
            drafted = after.spec_draft_tokens_total - before.spec_draft_tokens_total
            accepted = after.spec_accepted_tokens_total - before.spec_accepted_tokens_total
            tokens = sum(len(t) for t in ids_plain)
            rows.append({
                "workload": name, "concurrency": conc, "requests": len(convs),
                "tokens": tokens,
                "plain_tok_s": tokens / t_plain, "spec_tok_s": tokens / t_spec,
                "speedup": t_plain / t_spec,
                "drafted": drafted, "accepted": accepted,
                "acceptance": accepted / drafted if drafted else 0.0,
                "identical": ids_plain == ids_spec,
            })
            print(_format_row(rows[-1]), flush=True)
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "device": str(spec.engine.device)},
        "model": model or "smollm2-135m-instruct", "dtype": str(spec.engine.kv.dtype),
        "speculative_config": config, "max_tokens": max_tokens, "greedy": True,
        "timing": f"best of {repeats} interleaved runs per engine, order alternating",
        "acceptance_by_position": spec.engine.stats().spec_acceptance_by_position,
        "rows": rows,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(report, indent=2))
    _plot(rows, out / "spec.png")
    return report


def _format_row(r: dict[str, Any]) -> str:
    return (f"{r['workload']:>5} c={r['concurrency']:<3} plain {r['plain_tok_s']:7.1f} tok/s  "
            f"spec {r['spec_tok_s']:7.1f} tok/s  x{r['speedup']:.2f}  "
            f"accept {r['acceptance']:.2f}  identical={r['identical']}")


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == name]
        ax.plot([r["concurrency"] for r in mine], [r["speedup"] for r in mine], "o-", label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(0.97, color="red", lw=0.8, ls="--", label="0.97x floor")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("speed-up over plain decode")
    ax.set_title("mmserve speculative decoding (greedy, same run)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
