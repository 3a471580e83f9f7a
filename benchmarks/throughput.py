"""Run ``mmserve.bench.throughput.run_throughput`` from the command line (the flags are the
``ThroughputConfig`` fields). Usage, on the GPU machine from the repo root:

    PYTHONPATH=$PWD python benchmarks/throughput.py --models smollm2-135m llama3-8b --out-dir out

``--models`` takes the benchmark shapes (random weights) and the hub's models by name (real
weights from their GGUFs, as the server loads them; with ``--no-hf``), e.g.
``--models smollm2-135m-instruct --no-hf --variants invariant bf16head``.
"""

from __future__ import annotations

import argparse

from mmserve.bench.throughput import ThroughputConfig, run_throughput


def parse() -> argparse.Namespace:
    d = ThroughputConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(d.models))
    p.add_argument("--batch-sizes", nargs="+", type=int, default=list(d.batch_sizes))
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--decode-steps", type=int, default=d.decode_steps)
    p.add_argument("--prefill-len", type=int, default=d.prefill_len)
    p.add_argument("--eager-steps", type=int, default=d.eager_steps)
    p.add_argument(
        "--sync",
        dest="ahead",
        action="store_false",
        help="the host reads each step's tokens before launching the next (the "
        "default launches it first, as the engine's async scheduling does)",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        default=list(d.variants),
        help="invariant (fused, the engine path) | layered (no one-launch "
        "decode stack) | nopdl (PDL off) | unfused | cublas | "
        "fp8kv "
        "(invariant over an fp8 e4m3 KV cache, as --kv-cache-dtype fp8_e4m3) | "
        "bf16head (invariant, the LM head from its bf16 weight: with --q8-head)",
    )
    p.add_argument(
        "--q8-head",
        action="store_true",
        help="the LM head's random weight rounded to Q8_0 blocks, as the shipped "
        "GGUFs store theirs (the engine's head then reads the blocks)",
    )
    p.add_argument("--no-hf", dest="hf", action="store_false")
    p.add_argument("--hf-batch-sizes", nargs="+", type=int, default=list(d.hf_batch_sizes))
    p.add_argument("--hf-new-tokens", type=int, default=d.hf_new_tokens)
    p.add_argument("--hf-compile", action="store_true")
    p.add_argument("--out-dir", default=d.out_dir)
    p.add_argument(
        "--gemm-configs", default=None, help="tile shapes JSON (benchmarks/invariance.py)"
    )
    p.add_argument(
        "--tuning",
        default=None,
        help="JSON over the decode stack's StackTuning, e.g. '{\"bk\": 128}'",
    )
    return p.parse_args()


if __name__ == "__main__":
    args = parse()
    tuning = vars(args).pop("tuning")
    if tuning:
        from dataclasses import replace

        from mmserve.bench.engine_run import tuning_overrides
        from mmserve.kernels import settings

        now = settings.current()
        settings.install(replace(now, stack=replace(now.stack, **tuning_overrides(tuning))))
    run_throughput(args)
