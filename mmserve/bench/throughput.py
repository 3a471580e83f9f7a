"""``mmserve bench throughput``: mmserve's model path against HF transformers, one run, one GPU.

For each model shape (random bf16 weights: speed does not depend on the values):
copy bandwidth (the roofline), mmserve decode tok/s at each batch size through
CUDA graphs (batch-invariant Triton GEMMs, and cuBLAS for the cost of invariance; over
the bf16 KV cache, and over the engine's fp8 e4m3 one), batch-1 eager decode, TTFT /
prefill tok/s of a long prompt, and the same numbers for HF transformers on the same
weights. Writes ``throughput.json`` (+ a PNG when matplotlib is there) to ``out_dir``
and returns the dict.
"""

from __future__ import annotations

import gc
import json
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from mmserve.bench.limits import copy_bandwidth
from mmserve.bench.report import plot, table
from mmserve.bench.shapes import SHAPES, shape
from mmserve.kernels.fp8 import FP8_DTYPE

VARIANTS = ("invariant", "layered", "nopdl", "unfused", "cublas", "fp8kv", "bf16head")
# Variants whose KV cache is not in the model's dtype. Such a cache is lossy, so their tokens
# are scored against the reference variant instead of being required to equal them.
KV_DTYPES: dict[str, torch.dtype] = {"fp8kv": FP8_DTYPE}


@dataclass
class ThroughputConfig:
    models: tuple[str, ...] = ("smollm2-135m", "llama3-8b")
    batch_sizes: tuple[int, ...] = (1, 32, 64, 128)
    prompt_len: int = 128
    decode_steps: int = 128
    prefill_len: int = 2048
    # "invariant": the engine's CUDA path (Triton GEMMs with the fused layer kernels,
    # attention); "unfused": the same with kernels.fused off (norm, rope, write_kv, silu,
    # residual adds as separate launches); "cublas": batch invariance off (cuBLAS GEMMs);
    # "fp8kv": "invariant" over the engine's fp8 e4m3 KV cache (--kv-cache-dtype fp8_e4m3);
    # "nopdl": "invariant" with programmatic dependent launch off (kernels.triton_pdl);
    # "layered": "invariant" with one-token steps layer by layer, not as the one
    # persistent launch of kernels.decode_stack; "bf16head": "invariant" with the LM head
    # read from its bf16 weight where the model has Q8_0 blocks of it (q8_head)
    variants: tuple[str, ...] = ("invariant", "layered", "nopdl", "unfused", "cublas", "fp8kv")
    # the LM head's random weight rounded to Q8_0 blocks, as the shipped GGUFs store theirs
    # (the engine's head then reads the blocks: kernels/q8.py)
    q8_head: bool = False
    eager_steps: int = 32  # batch-1 decode without graphs (0: skip)
    # graph decode as the engine's async scheduling runs it on CUDA: each step launched
    # from the last one's argmax on the device before the host reads its tokens (False:
    # the host reads every step's tokens before launching the next)
    ahead: bool = True
    hf: bool = True
    hf_batch_sizes: tuple[int, ...] = (1, 32, 128)
    hf_new_tokens: int = 32
    hf_compile: bool = False  # static cache + torch.compile at batch 1 (minutes to compile)
    out_dir: str = "bench_out"
    gemm_configs: str | None = None  # JSON {bucket: tile shape} from benchmarks/invariance.py
    seed: int = 0

    def __post_init__(self) -> None:
        from mmserve.models.hub import KNOWN_MODELS

        for m in self.models:
            if m not in SHAPES and m not in KNOWN_MODELS:
                raise ValueError(
                    f"unknown model shape {m!r}; known: {', '.join(SHAPES)} "
                    f"(random weights), {', '.join(KNOWN_MODELS)} (real weights)"
                )
        if self.hf and any(m in KNOWN_MODELS for m in self.models):
            raise ValueError("the HF baselines run random shapes only: --no-hf with a real model")
        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"variant {v!r}: use one of {', '.join(VARIANTS)}")
        if "bf16head" in self.variants and not (
            self.q8_head or any(m in KNOWN_MODELS for m in self.models)
        ):
            raise ValueError(
                "variant bf16head is the Q8_0 head's reference: set q8_head (or "
                "run a real model: the shipped GGUFs' heads are Q8_0)"
            )
        if min(self.batch_sizes) < 1 or self.prompt_len < 1 or self.decode_steps < 1:
            raise ValueError("batch sizes, prompt_len and decode_steps must be >= 1")

    @classmethod
    def from_args(cls, args: Any) -> ThroughputConfig:
        """From this dataclass, a dict, or an argparse namespace (same field names)."""
        if isinstance(args, cls):
            return args
        src = args if isinstance(args, dict) else vars(args)
        kw = {f.name: src[f.name] for f in fields(cls) if src.get(f.name) is not None}
        for f in fields(cls):
            if f.name in kw and isinstance(getattr(cls, f.name, None), tuple):
                kw[f.name] = tuple(kw[f.name])
        return cls(**kw)


def run_throughput(args: Any) -> dict:
    """Run every shape; print the table; write JSON (+ PNG) under ``out_dir``."""
    cfg = ThroughputConfig.from_args(args)
    if not torch.cuda.is_available():
        raise RuntimeError("bench throughput needs a CUDA GPU; torch sees none")
    torch.manual_seed(cfg.seed)
    tiles = load_tile_configs(cfg.gemm_configs)
    result: dict = {
        "gemm_tile_configs": tiles,
        "config": asdict(cfg),
        "machine": machine(),
        "weights": "random (bf16) for the shapes"
        + (
            "; their LM head's weight rounded to Q8_0 blocks, as the shipped GGUFs store it"
            if cfg.q8_head
            else ""
        )
        + "; real for the hub's "
        "models (each model's own line)",
        "bandwidth": copy_bandwidth(),
        "models": {},
    }
    bw = max(result["bandwidth"]["gb_s"]) * 1e9
    for name in cfg.models:
        result["models"][name] = run_shape(cfg, name, bw)
        write(cfg, result)
    print(table(result))
    result["plot"] = plot(result, Path(cfg.out_dir) / "throughput.png")
    write(cfg, result)
    return result


def load_tile_configs(path: str | None) -> dict | None:
    """Apply tuned GEMM tile shapes (speed only: the invariant GEMM's bits do not move)."""
    if path is None:
        return None
    from mmserve.kernels import settings
    from mmserve.kernels.triton_matmul import BUCKETS

    table = {int(k): tuple(v) for k, v in json.loads(Path(path).read_text()).items()}
    if not set(table) <= set(BUCKETS):
        raise SystemExit(f"{path}: tile buckets are {BUCKETS}, got {sorted(table)}")
    tiles = tuple(sorted(table.items()))
    settings.install(replace(settings.current(), tiles=tiles))  # type: ignore[arg-type]
    return {str(k): list(v) for k, v in table.items()}


def machine() -> dict:
    import transformers

    p = torch.cuda.get_device_properties(0)
    return {
        "gpu": p.name,
        "sms": p.multi_processor_count,
        "memory_gib": p.total_memory / 2**30,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def write(cfg: ThroughputConfig, result: dict) -> None:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput.json").write_text(json.dumps(result, indent=1, default=str))


def run_shape(cfg: ThroughputConfig, name: str, bandwidth: float) -> dict:
    from mmserve.bench.engine_run import PagedDecoder, q8_head_weights, weight_bytes
    from mmserve.bench.hf_run import build_hf_model
    from mmserve.models.registry import build_model

    hf = None
    if name in SHAPES:
        config = shape(name)
        hf = build_hf_model(config)
        sd = q8_head_weights(hf) if cfg.q8_head else hf.state_dict()
        model = build_model(config, sd, torch.bfloat16, "cuda")  # shares tensors
        if cfg.q8_head and model.q8_head() is None:
            raise RuntimeError("the LM head's Q8_0 blocks were not attached")
    else:  # a real model as the server loads it (its GGUF converted once, bf16 on CUDA)
        from mmserve.models.hub import resolve_model
        from mmserve.models.registry import load_model
        from mmserve.models.weights import load_config

        path = resolve_model(name)
        config = load_config(path)
        model = load_model(path, torch.bfloat16, "cuda")
    wbytes = weight_bytes(model)
    out: dict = {
        "weights": "random (bf16)" if hf is not None else f"real ({name}, bf16)",
        "lm_head_q8": model.q8_head() is not None,
        "config": config,
        "weight_bytes": wbytes,
        "roofline_tok_s": bandwidth / wbytes,
        "engine": {},
    }
    max_len = max(cfg.prompt_len + cfg.decode_steps + 8, cfg.prefill_len + 8)
    make_decoder = partial(PagedDecoder, model, max(cfg.batch_sizes), max_len)
    out["engine"] = run_engine_variants(cfg, name, make_decoder, config["vocab_size"])
    out.update(row0_comparison(out["engine"], str(cfg.batch_sizes[0])))
    if cfg.hf and hf is not None:
        print(f"[{name}] HF transformers", flush=True)
        out["hf"] = hf_variants(cfg, hf, config["vocab_size"])
    del hf, model, make_decoder  # the partial holds the model too
    free_device_memory()
    return out


def kv_groups(variants: tuple[str, ...]) -> list[tuple[torch.dtype | None, list[str]]]:
    """``variants`` grouped by KV dtype (None: the model's), in order of first appearance."""
    groups: dict[torch.dtype | None, list[str]] = {}
    for v in variants:
        groups.setdefault(KV_DTYPES.get(v), []).append(v)
    return list(groups.items())


def run_engine_variants(
    cfg: ThroughputConfig, name: str, make_decoder: Callable[[torch.dtype | None], Any], vocab: int
) -> dict:
    """Every variant on a decoder whose KV cache has that variant's dtype; results in
    ``cfg.variants`` order. One decoder (KV + graph pools) is alive at a time: at 8B, batch
    128 x 2k tokens, the bf16 cache alone is ~35 GB beside 16 GB of weights."""
    out: dict = {}
    for kv_dtype, group in kv_groups(cfg.variants):
        dec = make_decoder(kv_dtype)
        for variant in group:
            print(f"[{name}] mmserve {variant}", flush=True)
            out[variant] = engine_variant(cfg, dec, variant, vocab)
        del dec  # before the next group's cache is allocated
        free_device_memory()
    return {v: out[v] for v in cfg.variants}


def free_device_memory() -> None:
    gc.collect()  # graphs and caches may sit in reference cycles
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def row0_comparison(engine: dict, batch: str) -> dict:
    """Row 0's tokens at ``batch`` against the reference ("invariant", else the first variant
    with an exact cache). Exact-cache variants are compared for equality; lossy-cache ones
    (fp8) get the fraction of equal tokens and the first step that differs."""
    rows = {v: r["decode"][batch]["row0"] for v, r in engine.items()}
    exact = [v for v in rows if v not in KV_DTYPES]
    ref = "invariant" if "invariant" in exact else next(iter(exact), None)
    if ref is None:
        return {"row0_tokens_equal_across_variants": {}, "row0_lossy_kv_agreement": {}}
    return {
        "row0_tokens_equal_across_variants": {v: rows[v] == rows[ref] for v in exact},
        "row0_lossy_kv_agreement": {
            v: {"reference": ref, **token_agreement(r, rows[ref])}
            for v, r in rows.items()
            if v in KV_DTYPES
        },
    }


def token_agreement(tokens: list[int], ref: list[int]) -> dict:
    """How far two greedy token streams agree; after a first difference they drift apart, as
    each continues its own text."""
    n = min(len(tokens), len(ref))
    same = [a == b for a, b in zip(tokens[:n], ref[:n], strict=True)]
    return {
        "tokens": n,
        "equal_fraction": sum(same) / n if n else 1.0,
        "first_mismatch": same.index(False) if not all(same) else None,
    }


def engine_variant(cfg: ThroughputConfig, dec, variant: str, vocab: int) -> dict:
    """One variant on ``dec`` (whose KV dtype the caller chose); fp8kv is the engine path."""
    from mmserve.kernels import settings

    now = settings.current()
    # the Q8_0 head on in every variant but its reference (bf16head)
    with settings.override(
        batch_invariant=variant != "cublas",
        q8_head=variant != "bf16head",
        fused=variant != "unfused",
        pdl=variant != "nopdl",
        decode_stack=now.decode_stack and variant != "layered",
    ):
        return measure_engine(cfg, dec, vocab)


def measure_engine(cfg: ThroughputConfig, dec, vocab: int) -> dict:
    from mmserve.engine.cuda_graphs import DEFAULT_SIZES

    sizes = tuple(s for s in DEFAULT_SIZES if s <= max(cfg.batch_sizes))
    sizes = tuple(sorted(set(sizes) | set(cfg.batch_sizes)))
    res: dict = {
        "kv_cache": {
            "dtype": str(dec.kv_dtype).removeprefix("torch."),
            "gib": dec.kv_bytes / 2**30,
        },
        "capture": dec.capture(sizes),
        "decode": {},
    }
    gen = torch.Generator().manual_seed(cfg.seed)
    row0 = torch.randint(0, vocab, (cfg.prompt_len,), generator=gen).tolist()
    for b in cfg.batch_sizes:
        prompts = [row0] + torch.randint(0, vocab, (b - 1, cfg.prompt_len), generator=gen).tolist()
        first = dec.prefill(prompts)
        r = dec.decode(first, cfg.prompt_len, cfg.decode_steps, graphs=True, ahead=cfg.ahead)
        res["decode"][str(b)] = {**asdict(r), "tok_s": r.tok_s}
    if cfg.eager_steps:
        first = dec.prefill([row0])
        r = dec.decode(first, cfg.prompt_len, cfg.eager_steps, graphs=False)
        res["eager_b1"] = {
            **asdict(r),
            "tok_s": r.tok_s,
            "same_tokens_as_graphs": r.row0 == rows0(res, len(r.row0)),
        }
    res["prefill"] = dec.ttft(cfg.prefill_len, vocab)
    rows = [d["row0"] for d in res["decode"].values()]
    res["row0_same_tokens_every_batch"] = all(r == rows[0] for r in rows)
    return res


def rows0(res: dict, steps: int) -> list[int]:
    """Row 0's first ``steps`` graph-decoded tokens (its prompt is the same at every size)."""
    return next(iter(res["decode"].values()))["row0"][:steps]


def hf_variants(cfg: ThroughputConfig, hf, vocab: int) -> dict:
    from mmserve.bench.hf_run import hf_compiled_decode, hf_decode, hf_ttft

    out: dict = {
        "eager": {
            str(b): hf_decode(hf, b, cfg.prompt_len, cfg.hf_new_tokens, vocab)
            for b in cfg.hf_batch_sizes
        }
    }
    out["prefill"] = hf_ttft(hf, cfg.prefill_len, vocab)
    if cfg.hf_compile:
        try:
            out["static_compile_b1"] = hf_compiled_decode(
                hf, 1, cfg.prompt_len, cfg.hf_new_tokens, vocab
            )
        except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
            out["static_compile_b1"] = {"error": repr(e)[:500]}
    return out
