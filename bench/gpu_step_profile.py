"""Where an engine step's wall time goes, plain vs verify, on the GPU (or CPU).

Wraps the engine's phases with timers (the forward is followed by a device sync so
GPU time lands in ``forward``, not in whichever phase syncs next) and runs the
``edit`` and ``chat`` workloads of ``mmserve bench spec`` with speculation off and with
a fixed k. Prints mean milliseconds per phase per step kind; the cost model the
controller learned is printed for comparison.

Usage: PYTHONPATH=$PWD python bench/gpu_step_profile.py MODEL [OUT.json] [--quick]
"""

from __future__ import annotations

import collections
import json
import sys
import time

import torch

from mmserve import LLM, SamplingParams
from mmserve.bench.spec_workloads import workload


def instrument(llm: LLM) -> dict:
    eng = llm.engine
    acc: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    cur: dict = {}

    def timed(name, fn, sync=False):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            if sync and torch.cuda.is_available():
                torch.cuda.synchronize()
            cur[name] = cur.get(name, 0.0) + time.perf_counter() - t
            return out
        return wrapper

    eng.runner.run = timed("forward", eng.runner.run, sync=True)
    eng.scheduler.schedule = timed("schedule", eng.scheduler.schedule)
    eng.sampler.sample = timed("sample", eng.sampler.sample)
    eng.appender.append = timed("append", eng.appender.append)
    if eng.spec is not None:
        eng.spec.propose = timed("propose", eng.spec.propose)
        eng.spec.verify = timed("verify", eng.spec.verify)
    step = eng.step

    def whole():
        cur.clear()
        t = time.perf_counter()
        out = step()
        total = time.perf_counter() - t
        reqs = eng.scheduler.running
        kind = "verify" if cur.get("verify") else "plain"
        key = f"{kind} b{len(reqs)}"
        for k, v in cur.items():
            acc[key][k].append(v)
        acc[key]["total"].append(total)
        acc[key]["tokens"].append(sum(len(o.new_token_ids) for o in out) if out else 0)
        return out

    eng.step = whole
    return acc


def summary(acc: dict) -> dict:
    out = {}
    for key, phases in sorted(acc.items()):
        n = len(phases["total"])
        out[key] = {"steps": n, **{p: round(1e3 * sum(v) / n, 3) for p, v in phases.items()
                                   if p != "tokens"},
                    "tokens_per_step": round(sum(phases["tokens"]) / n, 2)}
    return out


def main() -> None:
    model = sys.argv[1]
    quick = "--quick" in sys.argv  # a smoke run: 8 tokens, edit c=1 only
    report = {}
    for label, cfg in (("plain", None),
                       ("k4", {"method": "ngram", "num_speculative_tokens": 4}),
                       ("k2", {"method": "ngram", "num_speculative_tokens": 2}),
                       ("auto", {"method": "ngram", "num_speculative_tokens": "auto"})):
        llm = LLM(model, speculative_config=cfg, max_num_seqs=16)
        params = SamplingParams(temperature=0, max_tokens=8 if quick else 128)
        llm.chat(workload("edit", 2), params)  # warm-up
        for name in ("edit",) if quick else ("edit", "chat"):
            for conc in (1,) if quick else (1, 4):
                acc = instrument(llm)
                t = time.perf_counter()
                outs = llm.chat(workload(name, conc), params)
                dt = time.perf_counter() - t
                unwrap(llm)
                toks = sum(len(o.outputs[0].token_ids) for o in outs)
                res = {"tok_s": round(toks / dt, 1), "phases": summary(acc)}
                if llm.engine.spec is not None:
                    c = llm.engine.spec.controller
                    res["cost_model_ms"] = {
                        f"{kind}{n}": round(1e3 * c.step_cost(n, kind == "v"), 3)
                        for n in (conc, 3 * conc, 5 * conc) for kind in "pv"}
                report[f"{label} {name} c={conc}"] = res
                print(label, name, conc, json.dumps(res), flush=True)
        del llm
    if len(sys.argv) > 2 and not sys.argv[2].startswith("--"):
        with open(sys.argv[2], "w") as f:
            json.dump(report, f, indent=1)


def unwrap(llm: LLM) -> None:
    """Undo ``instrument``: it set instance attributes over the class methods."""
    eng = llm.engine
    for obj, names in ((eng, ["step"]), (eng.runner, ["run"]), (eng.scheduler, ["schedule"]),
                       (eng.sampler, ["sample"]), (eng.appender, ["append"]),
                       (eng.spec, ["propose", "verify"])):
        for n in names:
            if obj is not None and n in obj.__dict__:
                del obj.__dict__[n]


if __name__ == "__main__":
    main()
