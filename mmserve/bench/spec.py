"""``mmserve bench spec``: speculative decoding against plain decode, in the same run.

For every workload and concurrency the same prompts run through one engine with
speculation off (plain decode) and on, interleaved; the report gives tok/s of both,
the speed-up, acceptance, and whether the greedy outputs were identical (they must be).
Writes ``spec.json`` and ``spec.png`` (if matplotlib is installed) into ``out_dir``.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from mmserve.bench.spec_workloads import WORKLOADS, workload
from mmserve.llm import LLM
from mmserve.sampling_params import SamplingParams

FLOOR = 0.97  # issue 5: no workload below 0.97x plain decode
LEVEL = 0.9  # the coverage a row's interval must reach for a floor verdict (5+ pairs)


def _timed(
    llm: LLM, convs: list, params: SamplingParams, speculate: bool | None = None
) -> tuple[float, list[list[int]]]:
    """Seconds and token ids of one ``chat`` batch (``speculate``: switch it first)."""
    if speculate is not None:
        llm.engine.set_speculation(speculate)
    start = time.perf_counter()
    out = llm.chat(convs, params)
    return time.perf_counter() - start, [r.token_ids for r in out]


def median_interval(values: list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """A distribution-free interval for the median of what ``values`` were drawn from: the
    ``k``-th smallest and ``k``-th largest value, ``k`` as large as keeps the coverage
    ``1 - 2 P(Binomial(n, 1/2) < k)`` at or above ``level`` -> (low, high, coverage). With
    too few values for ``level`` it is (min, max) and the coverage they give."""
    xs = sorted(values)
    n = len(xs)
    assert n > 0
    best = 1
    for k in range(1, (n + 1) // 2 + 1):
        if 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n >= level:
            best = k
    coverage = 1 - 2 * sum(math.comb(n, i) for i in range(best)) / 2**n
    return xs[best - 1], xs[n - best], coverage


def floor_verdict(lo: float, hi: float, coverage: float) -> str:
    """ "met" / "below" where the median's interval (``median_interval``) lies wholly above /
    below ``FLOOR`` with at least ``LEVEL`` coverage, else "unclear"."""
    if coverage < LEVEL or lo < FLOOR <= hi:
        return "unclear"
    return "below" if hi < FLOOR else "met"


def run_spec_bench(
    model: str | None = None,
    speculative_config: dict | None = None,
    workloads: tuple[str, ...] = WORKLOADS,
    concurrencies: tuple[int, ...] = (1, 4, 16),
    max_tokens: int = 96,
    requests_per_slot: int = 1,
    repeats: int = 2,
    device: str = "auto",
    out_dir: str | Path = "bench/out",
    min_requests: int = 4,
) -> dict[str, Any]:
    """Plain decode is the same engine with speculation switched off between runs: the
    same weights, KV cache and CUDA graphs: two engines, both with speculation off, can
    differ from each other by more than the effect measured (docs/performance.md).

    A row runs ``concurrency * requests_per_slot`` requests, at least ``min_requests``:
    at concurrency 1 that is four requests one after another, not one ~50-token answer
    of ~20 ms, which the machine's noise alone can move by a large factor."""
    config = speculative_config or {"method": "ngram", "num_speculative_tokens": "auto"}
    spec = LLM(model, device=device, max_num_seqs=max(concurrencies), speculative_config=config)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    _timed(spec, workload("chat", 2), params, speculate=False)  # warm-up: allocator
    _timed(spec, workload("edit", 2) + workload("chat", 2), params, speculate=True)  # costs
    rows = []
    for name in workloads:
        for conc in concurrencies:
            convs = workload(name, max(conc * requests_per_slot, min_requests))
            spec.engine.scheduler.max_num_seqs = conc
            for on in (False, True):  # new shapes compile outside the timing
                _timed(spec, convs[:2], SamplingParams(temperature=0, max_tokens=8), on)
            spec.engine.blocks.reset_prefix_cache()
            before = spec.engine.stats()
            host = spec.engine.speculator
            assert host is not None
            host_before = (host.host_seconds, host.host_steps)
            vetoes_before = host.controller.vetoes
            plain_times, spec_times = [], []
            for i in range(repeats):  # interleaved pairs: drift hits both sides alike
                for on in (False, True) if i % 2 == 0 else (True, False):  # either first
                    dt, ids = _timed(spec, convs, params, speculate=on)
                    spec.engine.blocks.reset_prefix_cache()
                    if on:
                        spec_times.append(dt)
                        ids_spec = ids
                    else:
                        plain_times.append(dt)
                        ids_plain = ids
            t_plain, t_spec = min(plain_times), min(spec_times)
            # the speed-up is the median of each pair's ratio: a pair's two runs are next
            # to each other in time, and one lucky run on either side (which a ratio of
            # bests takes at face value) moves a median by one rank, not to its value
            ratios = [p / s for p, s in zip(plain_times, spec_times, strict=True)]
            paired = statistics.median(ratios)
            # how far the machine's noise leaves the median: a row is below the 0.97 floor
            # only if the interval is, and unclear where the interval holds 0.97 or covers
            # less than LEVEL (too few pairs)
            lo, hi, coverage = median_interval(ratios)
            after = spec.engine.stats()
            host_steps = host.host_steps - host_before[1]
            drafted = after.spec_draft_tokens_total - before.spec_draft_tokens_total
            accepted = after.spec_accepted_tokens_total - before.spec_accepted_tokens_total
            tokens = sum(len(t) for t in ids_plain)
            rows.append(
                {
                    "workload": name,
                    "concurrency": conc,
                    "requests": len(convs),
                    "tokens": tokens,
                    "plain_tok_s": tokens / t_plain,
                    "spec_tok_s": tokens / t_spec,
                    "speedup": paired,
                    "speedup_of_bests": t_plain / t_spec,
                    "speedup_interval": [lo, hi],
                    "speedup_interval_coverage": coverage,
                    "plain_seconds": plain_times,
                    "spec_seconds": spec_times,  # pair by pair
                    "floor_0_97": floor_verdict(lo, hi, coverage),
                    "drafted": drafted,
                    "accepted": accepted,
                    "acceptance": accepted / drafted if drafted else 0.0,
                    "identical": ids_plain == ids_spec,
                    "guard_pauses": after.spec_guard_pauses_total - before.spec_guard_pauses_total,
                    # steps whose drafts were held back because another request of the step
                    # would have run slower (mmserve.speculative.controller, nobody waiting)
                    "vetoed_steps": host.controller.vetoes - vetoes_before,
                    # what choosing k, drafting and the controller's bookkeeping cost the host
                    # each speculative step (measured here, on this machine's CPU)
                    "spec_host_us_per_step": 1e6
                    * (host.host_seconds - host_before[0])
                    / max(host_steps, 1),
                }
            )
            print(_format_row(rows[-1]), flush=True)
    spec.engine.set_speculation(True)
    report = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": str(spec.engine.device),
        },
        "model": model or "smollm2-135m-instruct",
        "dtype": str(spec.engine.kv.dtype),
        "speculative_config": config,
        "max_tokens": max_tokens,
        "greedy": True,
        "timing": f"one engine, speculation switched off for plain runs; {repeats} interleaved "
        "pairs alternating which goes first; tok/s from each side's best run, "
        "speedup the median of the pairs' ratios (speedup_of_bests: best vs best), "
        "speedup_interval a distribution-free interval for that median (order "
        "statistics of the ratios, its coverage beside it)",
        "acceptance_by_position": spec.engine.stats().spec_acceptance_by_position,
        "rows": rows,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(report, indent=2))
    _plot(rows, out / "spec.png")
    return report


def _format_row(r: dict[str, Any]) -> str:
    return (
        f"{r['workload']:>5} c={r['concurrency']:<3} plain {r['plain_tok_s']:7.1f} tok/s  "
        f"spec {r['spec_tok_s']:7.1f} tok/s  x{r['speedup']:.3f} "
        f"[{r['speedup_interval'][0]:.3f}, {r['speedup_interval'][1]:.3f}] (bests "
        f"x{r['speedup_of_bests']:.3f})  "
        f"accept {r['acceptance']:.2f}  identical={r['identical']}  "
        f"pauses {r['guard_pauses']}  spec host {r['spec_host_us_per_step']:.0f} us/step"
    )


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
        ys = [r["speedup"] for r in mine]
        spans = [
            [y - r["speedup_interval"][0] for y, r in zip(ys, mine, strict=True)],
            [r["speedup_interval"][1] - y for y, r in zip(ys, mine, strict=True)],
        ]
        ax.errorbar(
            [r["concurrency"] for r in mine], ys, yerr=spans, fmt="o-", capsize=3, label=name
        )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(FLOOR, color="red", lw=0.8, ls="--", label=f"{FLOOR}x floor")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("speed-up over plain decode")
    ax.set_title("mmserve speculative decoding (greedy, same run)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
