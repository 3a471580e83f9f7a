"""A/A noise floor of ``mmserve bench spec``: two identical plain engines, same protocol.

Same workloads, concurrencies, warm-ups and best-of-N interleaving as
``mmserve.bench.spec.run_spec_bench``, but both engines decode plainly. Any ratio away
from 1.0 is the bench's own noise on this machine, the yardstick for the spec rows.

Usage: PYTHONPATH=$PWD python bench/gpu_aa.py MODEL [REPEATS]
"""

from __future__ import annotations

import sys

from mmserve import LLM, SamplingParams
from mmserve.bench.spec import _timed
from mmserve.bench.spec_workloads import WORKLOADS, workload


def main() -> None:
    model, repeats = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    a, b = (LLM(model, max_num_seqs=16) for _ in range(2))
    params = SamplingParams(temperature=0, max_tokens=128)
    for llm in (a, b):
        _timed(llm, workload("chat", 2) + workload("edit", 2), params)
    for name in WORKLOADS:
        for conc in (1, 4, 16):
            convs = workload(name, conc)
            for llm in (a, b):
                llm.engine.scheduler.max_num_seqs = conc
                llm.chat(convs[:2], SamplingParams(temperature=0, max_tokens=8))
            ta = tb = float("inf")
            for _ in range(repeats):
                ta = min(ta, _timed(a, convs, params)[0])
                tb = min(tb, _timed(b, convs, params)[0])
                for llm in (a, b):
                    llm.engine.blocks.reset_prefix_cache()
            print(f"{name:>5} c={conc:<3} A/B time ratio x{ta / tb:.3f}", flush=True)


if __name__ == "__main__":
    main()
