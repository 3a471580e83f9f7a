"""Host time of the engine's per-step output work, as the engine core runs it and as it
ran before (CPU is enough).

``N`` greedy streams of ``--tokens`` tokens (``ignore_eos``) run through the default
model cut to its first layer (``sse_cpu_probe.cut_model``: the real tokenizer, so the
detokenizer does real work) on the CPU. The figure is the time a step spends in
``LLMEngine._update`` and ``LLMEngine._outputs`` (appending tokens, detokenizing, stop
checks, building the outputs), over the steps, per stream: the forward is left out. Two
ways, alternated:

- ``in-process``: text made by the engine and the cumulative ``token_ids``/``text``
  built every step (what ``AsyncEngine`` and ``LLM`` consume, and what the engine core
  did before);
- ``core``: what the engine core does now for a request without stop strings: token ids
  alone (``detokenize=False``; the API server makes the text, ``core_client.LocalText``)
  and no cumulative fields (``LLMEngine.cumulative_outputs`` False).

Usage: PYTHONPATH=$PWD python benchmarks/core_output_cost.py [--streams 64]
       [--tokens 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sse_cpu_probe import cut_model  # noqa: E402

from mmserve.config import EngineConfig  # noqa: E402
from mmserve.engine.engine import LLMEngine  # noqa: E402
from mmserve.engine.factory import create_engine  # noqa: E402
from mmserve.sampling_params import SamplingParams  # noqa: E402

SPENT = [0.0]


def _timed(f):
    def run(*args, **kwargs):
        start = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            SPENT[0] += time.perf_counter() - start

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    LLMEngine._update = _timed(LLMEngine._update)  # type: ignore[method-assign]
    LLMEngine._outputs = _timed(LLMEngine._outputs)  # type: ignore[method-assign]
    model = cut_model(1, Path(tempfile.mkdtemp()))
    engine = create_engine(
        EngineConfig(
            model=str(model),
            device="cpu",
            kv_cache_memory_mb=512,
            max_num_seqs=args.streams,
            max_num_batched_tokens=4096,
        )
    )
    prompt = engine.tokenizer.encode("Once upon a time", add_special_tokens=False)
    for r in range(args.rounds):
        for name, core in (("in-process", False), ("core", True)):
            engine.cumulative_outputs = not core
            params = SamplingParams(
                temperature=0, max_tokens=args.tokens, ignore_eos=True, detokenize=not core
            )
            for _ in range(args.streams):
                engine.add_request(prompt, params)
            SPENT[0], steps = 0.0, 0
            while engine.has_unfinished():
                engine.step()
                steps += 1
            us = SPENT[0] / steps * 1e6
            print(
                f"round {r + 1} {name:>10}: {us:7.0f} us of output work a step "
                f"({steps} steps), {us / args.streams:5.1f} us a token",
                flush=True,
            )


if __name__ == "__main__":
    main()
