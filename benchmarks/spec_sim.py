"""The speculation controller on a GPU's clock, run on CPU: decisions cheap to iterate on.

The real engine (default model, CPU, greedy) runs the ``mmserve bench spec`` workloads,
but every step is charged a synthetic H200 time instead of its CPU time, and the
controller is fed that time and told it replays CUDA graphs (``padded``), as on the GPU.
The profile is fitted to an H200 step profile of SmolLM2-135M (bf16, CUDA graphs; the
per-kind step times ``benchmarks/spec_breakdown.py`` prints):

* graph step (batch bucket ``bs``, query bucket ``q``, as ``DecodeGraphs`` pads them):
  forward ``1.22 + 0.006 * bs * q`` ms; host ``0.20 + 0.035`` ms a sequence, plus
  ``0.03 + 0.012`` ms a sequence for drafting and verifying when the step drafts;
* a step carrying a prefill chunk runs eagerly: ``6 + 0.01`` ms a token.

Tokens differ from the GPU's (fp32 here, bf16 there), the shape of each workload does
not: how much is copyable, where the preamble is. The output is simulated time, plain
against speculative, per workload and concurrency: a check of the controller's choices
(k per step, probes), not a speed measurement.

Usage: python benchmarks/spec_sim.py [--workloads edit,chat] [--concurrency 1,4,16]
       [--max-tokens 128] [--trace] [--model PATH] [--real-clock]
       [--noise SIGMA] [--spike P] [--seed N]
(``--real-clock`` on a GPU: the same trace with measured step times.)
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import time

from mmserve import LLM, SamplingParams
from mmserve.bench.spec_workloads import WORKLOADS, workload
from mmserve.engine.cuda_graphs import DEFAULT_SIZES

QSIZES = (1, 2, 3, 5, 9)  # the engine's verify buckets for k_max = 8
# measurement noise the controller sees (``--noise``): each step's time times
# exp(N(0, sigma)), and twice that with probability ``spike``; the simulated total is
# charged the noiseless time, so the result measures the decisions, not the dice
NOISE = {"sigma": 0.0, "spike": 0.0}
_rng = random.Random(0)


def noisy(ms: float) -> float:
    if not NOISE["sigma"] and not NOISE["spike"]:
        return ms
    ms *= math.exp(_rng.gauss(0.0, NOISE["sigma"]))
    return ms * 2.0 if _rng.random() < NOISE["spike"] else ms


def step_ms(seqs) -> tuple[float, int, bool]:
    """(synthetic ms, rows the forward computes, graph replay) for one scheduled step."""
    tokens = sum(s.num_tokens for s in seqs)
    if any(s.num_real != 1 for s in seqs):
        return 6.0 + 0.01 * tokens, tokens, False
    bs = DEFAULT_SIZES[bisect.bisect_left(DEFAULT_SIZES, len(seqs))]
    q = QSIZES[bisect.bisect_left(QSIZES, max(s.num_tokens for s in seqs))]
    ms = 1.22 + 0.006 * bs * q + 0.20 + 0.035 * len(seqs)
    if any(s.draft for s in seqs):
        ms += 0.03 + 0.012 * len(seqs)
    return ms, len(seqs) * q, True


class SimClock:
    """Wraps an engine: each step is charged ``step_ms`` and the controller sees it.

    ``real``: charge the step's wall time instead and leave the controller alone (on a
    GPU: the same trace, on the real clock)."""

    def __init__(self, llm: LLM, trace: bool = False, real: bool = False) -> None:
        self.eng, self.total, self.trace, self.log = llm.engine, 0.0, trace, []
        self._last: tuple[float, int, bool] = (0.0, 0, False)
        run, step = self.eng.runner.run, self.eng.step

        def timed_run(seqs):
            self._last = step_ms(seqs)
            if not real:
                self.total += self._last[0] / 1e3
            if self.trace:
                self.log.append([[len(s.draft) for s in seqs], 0.0])
            return run(seqs)

        def timed_step():
            t = time.perf_counter()
            out = step()
            dt = time.perf_counter() - t
            if real:
                self.total += dt
            if self.trace and self.log and self.log[-1][1] == 0.0:
                self.log[-1][1] = round(dt * 1e3, 3)
            return out

        self.eng.runner.run, self.eng.step = timed_run, timed_step
        if self.eng.spec is not None and not real:
            spec = self.eng.spec
            spec.controller.padded = True
            spec.controller.query_sizes = QSIZES
            record = spec.record_step

            def record_step(
                num_tokens, seconds, verify, graph, emitted=0, sequences=0, quiet=False
            ):
                ms, rows, graph = self._last
                record(rows, noisy(ms) / 1e3, verify, graph, emitted, sequences, quiet)

            spec.record_step = record_step


def run(names, concurrencies, max_tokens, trace, model=None, real=False) -> list[dict]:
    plain = LLM(model, max_num_seqs=max(concurrencies))
    spec = LLM(
        model,
        max_num_seqs=max(concurrencies),
        speculative_config={"method": "ngram", "num_speculative_tokens": "auto"},
    )
    clocks = {"plain": SimClock(plain, trace, real), "spec": SimClock(spec, trace, real)}
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    spec.chat(workload("edit", 2) + workload("chat", 2), params)  # the bench's warm-up
    rows = []
    for name in names:
        for conc in concurrencies:
            convs = workload(name, conc)
            t, ids, drafted = {}, {}, 0
            for label, llm in (("plain", plain), ("spec", spec)):
                llm.engine.scheduler.max_num_seqs = conc
                llm.engine.blocks.reset_prefix_cache()
                clock = clocks[label]
                clock.log.clear()
                before, stats = clock.total, llm.engine.stats()
                ids[label] = [r.outputs[0].token_ids for r in llm.chat(convs, params)]
                t[label] = clock.total - before
                if label == "spec":
                    after = llm.engine.stats()
                    drafted = after.spec_draft_tokens_total - stats.spec_draft_tokens_total
                    accepted = after.spec_accepted_tokens_total - stats.spec_accepted_tokens_total
            tokens = sum(map(len, ids["plain"]))
            row = {
                "workload": name,
                "concurrency": conc,
                "tokens": tokens,
                "sim_speedup": round(t["plain"] / t["spec"], 3),
                "drafted": drafted,
                "accepted": accepted,
                "identical": ids["plain"] == ids["spec"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if trace:
                for label in ("plain", "spec"):
                    steps = clocks[label].log
                    print(
                        f"  {label} k:ms per step:",
                        " ".join(f"{','.join(map(str, ks))}:{ms}" for ks, ms in steps),
                    )
                if spec.engine.spec is not None:
                    c = spec.engine.spec.controller
                    print("  realized-throughput pauses so far:", c.pauses)
                    print(
                        "  cost model ms (plain/verify at rows):",
                        {
                            n: (
                                round(1e3 * c.step_cost(n), 3),
                                round(1e3 * c.step_cost(n, True), 3),
                            )
                            for n in (conc, 2 * conc, 3 * conc, 5 * conc, 9 * conc)
                        },
                    )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--trace", action="store_true", help="print k per request per step")
    p.add_argument("--model", default=None, help="default: the default model")
    p.add_argument(
        "--real-clock",
        action="store_true",
        help="wall time, controller untouched (on a GPU: the real trace)",
    )
    p.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="sigma of the log-normal noise on the step times the controller sees",
    )
    p.add_argument(
        "--spike",
        type=float,
        default=0.0,
        help="probability that a measured step takes twice as long",
    )
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    NOISE.update(sigma=a.noise, spike=a.spike)
    _rng.seed(a.seed)
    run(
        a.workloads.split(","),
        [int(c) for c in a.concurrency.split(",")],
        a.max_tokens,
        a.trace,
        a.model,
        a.real_clock,
    )


if __name__ == "__main__":
    main()
