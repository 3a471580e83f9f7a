"""What batch invariance costs on CPU: the engine with fixed-tile products vs plain F.linear.

Same weights, same prompts, same run: greedy decode throughput at batch 1 and 16 with
``batch_invariant`` on and off, plus whether the outputs matched. Writes JSON to argv[1].

Usage: PYTHONPATH=$PWD python benchmarks/cpu_invariance_cost.py [bench_out/cpu_invariance.json]
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import torch

from benchmarks.prompts import PROMPTS
from mmserve import LLM, SamplingParams


def measure(invariant: bool, batch: int, max_tokens: int = 48) -> dict:
    llm = LLM(batch_invariant=invariant, max_num_seqs=batch)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    prompts = PROMPTS[:batch]
    times = []
    for _ in range(2):
        start = time.perf_counter()
        out = llm.generate(prompts, params)
        times.append(time.perf_counter() - start)
    tokens = sum(len(r.token_ids) for r in out)
    return {
        "invariant": invariant,
        "batch": batch,
        "tok_s": tokens / min(times),
        "seconds": min(times),
        "token_ids": [r.token_ids for r in out],
    }


def main() -> None:
    rows = []
    for batch in (1, 16):
        on, off = measure(True, batch), measure(False, batch)
        rows.append(
            {
                "batch": batch,
                "invariant_tok_s": on["tok_s"],
                "plain_tok_s": off["tok_s"],
                "cost": off["tok_s"] / on["tok_s"],
                "same_tokens": on["token_ids"] == off["token_ids"],
            }
        )
        print(
            f"batch {batch:2d}: invariant {on['tok_s']:6.1f} tok/s, plain F.linear "
            f"{off['tok_s']:6.1f} tok/s -> invariance costs x{rows[-1]['cost']:.2f}; "
            f"same tokens: {rows[-1]['same_tokens']}",
            flush=True,
        )
    report = {
        "machine": platform.platform(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "model": "smollm2-135m-instruct fp32",
        "max_tokens": 48,
        "rows": rows,
    }
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "bench_out/cpu_invariance.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
