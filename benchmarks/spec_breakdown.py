"""Where a speculative run's time goes against plain decode's, step kind by step kind.

For each workload at concurrency 1 (the spec bench's four requests one after another,
greedy, the bench's ``max_tokens``), plain and speculative runs alternate on one engine;
every engine step is timed (``perf_counter`` around ``LLMEngine.step``, no sync added)
and classed by what it ran: ``prefill`` (a prompt chunk), ``plain`` (a synchronous
decode), ``ahead`` (a step whose decode was launched a step early: async scheduling),
``verify`` (a step with drafts); ``_pre``: launched in the last call, once its tokens
were in, before its outputs. Per kind: steps, total ms, us a call, the wait for the
sampler's tokens (GPU time not hidden), and us a call in each host piece (``propose``,
of it the controller's ``choose`` and the drafting ``_draft``; ``schedule``; ``run``: the
runner's host work up to the launch, of it the graphs' input ``_fill``; ``append``, ...;
a call that prelaunches holds the next step's ``propose``, ``schedule`` and ``run``).

Usage (GPU): PYTHONPATH=$PWD python benchmarks/spec_breakdown.py MODEL.gguf OUT.json
       [--workloads edit,code,chat] [--repeats 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import time

from mmserve import LLM, SamplingParams
from mmserve.bench.spec_workloads import workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--workloads", default="edit,code,chat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--bench-warmup",
        action="store_true",
        help="first the spec bench's warm-up (edit + chat at concurrency 4)",
    )
    args = ap.parse_args()
    llm = LLM(
        args.model,
        device=args.device,
        max_num_seqs=16,
        speculative_config={"method": "ngram", "num_speculative_tokens": "auto"},
    )
    eng = llm.engine
    eng.scheduler.max_num_seqs = 1
    state: dict = {}
    stats: collections.defaultdict = collections.defaultdict(collections.Counter)
    kinds: dict[int, str] = {}  # id(step's logits) -> kind, for steps prelaunched
    runner_run = eng.runner.run
    eng_sample, eng_step = eng._sample, eng.step

    def run(seqs):
        kind = (
            "prefill"
            if any(s.num_real != 1 for s in seqs)
            else "verify"
            if any(s.draft for s in seqs)
            else "plain"
        )
        state.setdefault("kind", kind)  # a call's first launch is its own step
        result = runner_run(seqs)
        kinds[id(result)] = kind
        return result

    def sample(seqs, result):
        t = time.perf_counter()
        out = eng_sample(seqs, result)
        state["wait"] = time.perf_counter() - t
        return out

    def step():
        state.clear()
        pre = eng.launch.pending
        t = time.perf_counter()
        out = eng_step()
        dt = time.perf_counter() - t
        if pre is None:
            kind = state.get("kind", "none")
        elif not hasattr(pre, "tokens"):  # launched in the last call, before its outputs
            kind = kinds.get(id(pre.result), "none") + "_pre"
        else:
            kind = "ahead"
        if len(kinds) > 64:
            kinds.clear()
        rec = stats[kind]
        rec["steps"] += 1
        rec["s"] += dt
        rec["wait_s"] += state.get("wait", 0.0)
        for key, v in pieces.items():
            rec["p:" + key] += v
        pieces.clear()
        return out

    eng.runner.run = run
    pieces: collections.Counter = collections.Counter()  # host seconds by piece, this call

    def timed(obj, name, key):
        fn = getattr(obj, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                pieces[key] += time.perf_counter() - t

        setattr(obj, name, wrapper)

    spec = eng.speculator
    assert spec is not None
    graphs = eng.runner.graphs
    for obj, name in (
        (spec, "propose"),
        (spec, "propose_ahead"),
        (spec, "verify_greedy"),
        (spec, "record_step"),
        (spec.controller, "choose"),
        (spec, "_draft"),
        (eng.scheduler, "schedule"),
        (eng.appender, "append"),
        (eng.appender, "catch_up"),
        (eng.runner, "run"),
        (graphs, "_fill"),
        (eng, "_commit"),
        (eng.blocks, "truncate"),
    ):
        if hasattr(obj, name):  # (an older engine may lack one; CPU: no graphs)
            timed(obj, name, name)
    eng._sample, eng.step = sample, step
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    if args.bench_warmup:  # as mmserve.bench.spec does it, with 16 slots
        eng.scheduler.max_num_seqs = 16
        eng.set_speculation(False)
        llm.chat(workload("chat", 2), params)
        eng.set_speculation(True)
        llm.chat(workload("edit", 2) + workload("chat", 2), params)
        eng.scheduler.max_num_seqs = 1
    report = {}
    for name in args.workloads.split(","):
        convs = workload(name, 4)
        for on in (False, True):  # warm the shapes
            eng.set_speculation(on)
            llm.chat(convs[:2], SamplingParams(temperature=0, max_tokens=8))
        res = {}
        for on in (False, True) * args.repeats:
            eng.set_speculation(on)
            stats.clear()
            drafted = eng.stats().spec_draft_tokens_total
            t = time.perf_counter()
            out = llm.chat(convs, params)
            wall = time.perf_counter() - t
            eng.blocks.reset_prefix_cache()
            key = "spec" if on else "plain"
            res.setdefault(key, []).append(
                {
                    "wall_ms": 1e3 * wall,
                    "tokens": sum(len(r.token_ids) for r in out),
                    "drafted": eng.stats().spec_draft_tokens_total - drafted,
                    "kinds": {
                        k: {
                            "steps": v["steps"],
                            "ms": round(1e3 * v["s"], 3),
                            "us_per_step": round(1e6 * v["s"] / v["steps"], 1),
                            "wait_us": round(1e6 * v["wait_s"] / v["steps"], 1),
                            **{
                                key[2:]: round(1e6 * x / v["steps"], 1)
                                for key, x in v.items()
                                if key.startswith("p:")
                            },
                        }
                        for k, v in stats.items()
                    },
                }
            )
        report[name] = res
        for key in ("plain", "spec"):
            best = min(res[key], key=lambda r: r["wall_ms"])
            print(
                name,
                key,
                round(best["wall_ms"], 2),
                "ms",
                best["tokens"],
                "tok",
                json.dumps(best["kinds"]),
                flush=True,
            )
            print(
                "  runs ms",
                [round(r["wall_ms"], 1) for r in res[key]],
                "drafted",
                [r["drafted"] for r in res[key]],
                flush=True,
            )
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
