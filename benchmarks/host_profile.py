"""Where a plain decode step's host time goes, on the GPU: the engine against a bare loop.

For batch sizes 1, 4 and 16 (greedy, ``ignore_eos``, the real model, CUDA graphs):

1. ``engine``: ``LLM.generate`` tok/s (best of 3) with async scheduling off and on
   (alternated; the same tokens asserted), and per step (off) the host time of each
   phase (``schedule``, ``run``: fill + copy + replay launch, ``sample``: argmax + the
   sync that waits for the GPU, ``append``: detokenize + stop checks, the rest), timed
   with ``perf_counter`` around the engine's own calls (no sync added);
2. ``bare``: the same graph replayed in a loop with only ``argmax().tolist()`` between
   steps (the least host work a synchronous step can have), and back to back with no
   host work (the GPU's own step time);
3. ``cprofile``: the engine's steps under cProfile, the top functions by own time.

Usage: PYTHONPATH=$PWD python benchmarks/host_profile.py MODEL.gguf OUT_DIR [--batches 1,16]
       [--no-cprofile] [--temperature T]   (T > 0: seeded sampling. Run twice per code
       version, alternated, for an A/B on one start: the host's speed can differ ~2x
       between two starts of the same machine)
"""

from __future__ import annotations

import collections
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

from mmserve import LLM, SamplingParams

TOKENS = 256


def timed(acc: dict, name: str, obj, attr: str) -> None:
    fn = getattr(obj, attr)

    def wrapper(*a, **kw):
        t = time.perf_counter()
        out = fn(*a, **kw)
        acc[name] += time.perf_counter() - t
        return out

    setattr(obj, attr, wrapper)


def engine_run(llm: LLM, batch: int, profile: bool = True, temperature: float = 0.0) -> dict:
    params = SamplingParams(
        temperature=temperature, seed=1 if temperature else None, max_tokens=TOKENS, ignore_eos=True
    )
    prompts = [f"Story number {i}: once upon a time" for i in range(batch)]
    eng = llm.engine
    default = eng.async_scheduling
    llm.generate(prompts, params)  # warm-up
    best = {False: 0.0, True: 0.0}
    ids = {}
    for i in range(6):  # async scheduling off and on, alternated
        eng.async_scheduling = bool(i % 2)
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        dt = time.perf_counter() - t
        rate = sum(len(o.outputs[0].token_ids) for o in outs) / dt
        best[eng.async_scheduling] = max(best[eng.async_scheduling], rate)
        ids[eng.async_scheduling] = [o.outputs[0].token_ids for o in outs]
    same = ids[False] == ids[True]
    eng.async_scheduling = False  # the phases below: one step at a time
    acc: dict = collections.defaultdict(float)
    timed(acc, "schedule", eng.scheduler, "schedule")
    timed(acc, "run", eng.runner, "run")
    timed(acc, "sample", eng.sampler, "sample")
    timed(acc, "append", eng.appender, "append")
    timed(acc, "step", eng, "step")
    steps = [0]
    inner = eng.step

    def counted():
        steps[0] += 1
        return inner()

    eng.step = counted
    llm.generate(prompts, params)
    for o, names in (
        (eng, ["step"]),
        (eng.runner, ["run"]),
        (eng.scheduler, ["schedule"]),
        (eng.sampler, ["sample"]),
        (eng.appender, ["append"]),
    ):
        for n in names:
            del o.__dict__[n]
    n = steps[0]
    per = {k: round(1e6 * v / n, 1) for k, v in acc.items()}
    per["other"] = round(
        per["step"] - sum(per[k] for k in ("schedule", "run", "sample", "append")), 1
    )
    eng.async_scheduling = default
    out = {
        "tok_s_best": round(best[False], 1),
        "async_tok_s_best": round(best[True], 1),
        "async_same_tokens": same,
        "steps": n,
        "us_per_step": per,
    }
    if not profile:
        return out
    pr = cProfile.Profile()
    pr.enable()
    llm.generate(prompts, params)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    return {**out, "cprofile_top": s.getvalue()}


@torch.inference_mode()
def bare_run(llm: LLM, batch: int) -> dict:
    eng = llm.engine
    graphs = eng.runner.graphs
    ids = [1] * batch
    pos = [100] * batch
    tables = np.arange(1, 1 + batch * 16, dtype=np.int64).reshape(batch, 16)
    out = {}
    for label, host in (("argmax_tolist", True), ("back_to_back", False)):
        for _ in range(20):
            graphs.run(ids, pos, tables, 16).argmax(-1).tolist()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(TOKENS):
            logits = graphs.run(ids, pos, tables, 16)
            if host:
                logits.argmax(-1).tolist()
        torch.cuda.synchronize()
        out[label + "_us"] = round(1e6 * (time.perf_counter() - t) / TOKENS, 1)
    return out


def main() -> None:
    model, out_dir = sys.argv[1], Path(sys.argv[2])
    args = sys.argv[3:]
    batches = (
        [int(b) for b in args[args.index("--batches") + 1].split(",")]
        if "--batches" in args
        else [1, 4, 16]
    )
    profile = "--no-cprofile" not in args
    temperature = float(args[args.index("--temperature") + 1]) if "--temperature" in args else 0.0
    out_dir.mkdir(parents=True, exist_ok=True)
    llm = LLM(model, max_num_seqs=16)
    report: dict = {"temperature": temperature}
    for b in batches:
        r = engine_run(llm, b, profile, temperature)
        if profile:
            (out_dir / f"cprofile_b{b}.txt").write_text(r.pop("cprofile_top"))
        report[f"b{b}"] = {"engine": r}
        print(b, json.dumps(r), flush=True)
    # last: these replays write KV into blocks no request owns (the prefix cache's too)
    for b in batches:
        report[f"b{b}"]["bare"] = bare_run(llm, b)
        print(b, json.dumps(report[f"b{b}"]["bare"]), flush=True)
    (out_dir / "host_profile.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
