"""A/A noise floor of ``mmserve bench spec``: plain decode against plain decode.

Same workloads, concurrencies, warm-ups and best-of-N interleaving as
``mmserve.bench.spec.run_spec_bench``, but both sides decode plainly: "engines" (two
engines, the protocol before session 3) or "one" (one engine twice, the protocol
now). Any ratio away from 1.0 is the bench's own noise, the yardstick for the spec rows.

Usage: PYTHONPATH=$PWD python bench/gpu_aa.py MODEL [REPEATS] [one|engines]
"""

from __future__ import annotations

import sys

from mmserve import LLM, SamplingParams
from mmserve.bench.spec import _timed
from mmserve.bench.spec_workloads import WORKLOADS, workload


def main() -> None:
    model, repeats = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    one = (sys.argv[3] if len(sys.argv) > 3 else "one") == "one"
    a = LLM(model, max_num_seqs=16)
    b = a if one else LLM(model, max_num_seqs=16)
    params = SamplingParams(temperature=0, max_tokens=128)
    for llm in (a, b):
        _timed(llm, workload("chat", 2) + workload("edit", 2), params)
    for name in WORKLOADS:
        for conc in (1, 4, 16):
            convs = workload(name, conc)
            for llm in (a, b):
                llm.engine.scheduler.max_num_seqs = conc
                llm.chat(convs[:2], SamplingParams(temperature=0, max_tokens=8))
            best = [float("inf"), float("inf")]
            for i in range(repeats):  # alternating which side goes first, as the bench does
                for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                    llm = (a, b)[side]
                    best[side] = min(best[side], _timed(llm, convs, params)[0])
                    llm.engine.blocks.reset_prefix_cache()
            ta, tb = best
            print(f"{name:>5} c={conc:<3} A/B time ratio x{ta / tb:.3f}", flush=True)


if __name__ == "__main__":
    main()
