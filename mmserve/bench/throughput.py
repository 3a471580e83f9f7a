"""``mmserve bench throughput``: mmserve's model path against HF transformers, one run, one GPU.

For each model shape (random bf16 weights: speed does not depend on the values):
copy bandwidth (the roofline), mmserve decode tok/s at each batch size through
CUDA graphs (batch-invariant Triton GEMMs, and cuBLAS for the cost of invariance),
batch-1 eager decode, TTFT / prefill tok/s of a long prompt, and the same numbers
for HF transformers on the same weights. Writes ``throughput.json`` (+ a PNG when
matplotlib is there) to ``out_dir`` and returns the dict.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from mmserve.bench.limits import copy_bandwidth
from mmserve.bench.report import plot, table
from mmserve.bench.shapes import SHAPES, shape

VARIANTS = ("invariant", "unfused", "cublas")


@dataclass
class ThroughputConfig:
    models: tuple[str, ...] = ("smollm2-135m", "llama3-8b")
    batch_sizes: tuple[int, ...] = (1, 32, 64, 128)
    prompt_len: int = 128
    decode_steps: int = 128
    prefill_len: int = 2048
    # "invariant": the engine's CUDA path (Triton GEMMs with the fused layer kernels,
    # attention); "unfused": the same with kernels.fused off (norm, rope, write_kv, silu,
    # residual adds as separate launches); "cublas": batch invariance off (cuBLAS GEMMs)
    variants: tuple[str, ...] = VARIANTS
    eager_steps: int = 32  # batch-1 decode without graphs (0: skip)
    hf: bool = True
    hf_batch_sizes: tuple[int, ...] = (1, 32, 128)
    hf_new_tokens: int = 32
    hf_compile: bool = False  # static cache + torch.compile at batch 1 (minutes to compile)
    out_dir: str = "bench_out"
    gemm_configs: str | None = None  # JSON {bucket: tile shape} from bench/invariance.py
    seed: int = 0

    def __post_init__(self) -> None:
        for m in self.models:
            if m not in SHAPES:
                raise ValueError(f"unknown model shape {m!r}; known: {', '.join(SHAPES)}")
        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"variant {v!r}: use one of {', '.join(VARIANTS)}")
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
    result: dict = {"gemm_tile_configs": tiles, "config": asdict(cfg), "machine": machine(),
                    "weights": "random (bf16)",
                    "bandwidth": copy_bandwidth(), "models": {}}
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
    from mmserve.kernels.triton_matmul import set_tile_configs

    table = {int(k): tuple(v) for k, v in json.loads(Path(path).read_text()).items()}
    set_tile_configs(table)  # type: ignore[arg-type]
    return {str(k): list(v) for k, v in table.items()}


def machine() -> dict:
    import transformers

    p = torch.cuda.get_device_properties(0)
    return {"gpu": p.name, "sms": p.multi_processor_count, "memory_gib": p.total_memory / 2**30,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def write(cfg: ThroughputConfig, result: dict) -> None:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput.json").write_text(json.dumps(result, indent=1, default=str))


def run_shape(cfg: ThroughputConfig, name: str, bandwidth: float) -> dict:
    from mmserve.bench.engine_run import PagedDecoder
    from mmserve.bench.hf_run import build_hf_model
    from mmserve.models.registry import build_model

    config = shape(name)
    hf = build_hf_model(config)
    model = build_model(config, hf.state_dict(), torch.bfloat16, "cuda")  # shares tensors
    weight_bytes = sum({p.data_ptr(): p.numel() * p.element_size()
                        for p in model.parameters()}.values())
    out: dict = {"config": config, "weight_bytes": weight_bytes,
                 "roofline_tok_s": bandwidth / weight_bytes, "engine": {}}
    max_len = max(cfg.prompt_len + cfg.decode_steps + 8, cfg.prefill_len + 8)
    dec = PagedDecoder(model, max(cfg.batch_sizes), max_len)
    for variant in cfg.variants:
        print(f"[{name}] mmserve {variant}", flush=True)
        out["engine"][variant] = engine_variant(cfg, dec, variant, config["vocab_size"])
    rows = {v: r["decode"][str(cfg.batch_sizes[0])]["row0"] for v, r in out["engine"].items()}
    out["row0_tokens_equal_across_variants"] = {v: r == next(iter(rows.values()))
                                                for v, r in rows.items()}
    del dec
    torch.cuda.empty_cache()
    if cfg.hf:
        print(f"[{name}] HF transformers", flush=True)
        out["hf"] = hf_variants(cfg, hf, config["vocab_size"])
    del hf, model
    torch.cuda.empty_cache()
    return out


def engine_variant(cfg: ThroughputConfig, dec, variant: str, vocab: int) -> dict:
    from mmserve.kernels.fused import set_fused_enabled
    from mmserve.kernels.linear import set_batch_invariant

    set_batch_invariant(variant != "cublas")
    set_fused_enabled(variant != "unfused")
    try:
        return measure_engine(cfg, dec, vocab)
    finally:
        set_batch_invariant(True)
        set_fused_enabled(True)


def measure_engine(cfg: ThroughputConfig, dec, vocab: int) -> dict:
    from mmserve.engine.cuda_graphs import DEFAULT_SIZES

    sizes = tuple(s for s in DEFAULT_SIZES if s <= max(cfg.batch_sizes))
    sizes = tuple(sorted(set(sizes) | set(cfg.batch_sizes)))
    res: dict = {"capture": dec.capture(sizes), "decode": {}}
    gen = torch.Generator().manual_seed(cfg.seed)
    row0 = torch.randint(0, vocab, (cfg.prompt_len,), generator=gen).tolist()
    for b in cfg.batch_sizes:
        prompts = [row0] + torch.randint(0, vocab, (b - 1, cfg.prompt_len),
                                         generator=gen).tolist()
        first = dec.prefill(prompts)
        r = dec.decode(first, cfg.prompt_len, cfg.decode_steps, graphs=True)
        res["decode"][str(b)] = {**asdict(r), "tok_s": r.tok_s}
    if cfg.eager_steps:
        first = dec.prefill([row0])
        r = dec.decode(first, cfg.prompt_len, cfg.eager_steps, graphs=False)
        res["eager_b1"] = {**asdict(r), "tok_s": r.tok_s,
                           "same_tokens_as_graphs": r.row0 == rows0(res, len(r.row0))}
    res["prefill"] = dec.ttft(cfg.prefill_len, vocab)
    rows = [d["row0"] for d in res["decode"].values()]
    res["row0_same_tokens_every_batch"] = all(r == rows[0] for r in rows)
    return res


def rows0(res: dict, steps: int) -> list[int]:
    """Row 0's first ``steps`` graph-decoded tokens (its prompt is the same at every size)."""
    return next(iter(res["decode"].values()))["row0"][:steps]



def hf_variants(cfg: ThroughputConfig, hf, vocab: int) -> dict:
    from mmserve.bench.hf_run import hf_compiled_decode, hf_decode, hf_ttft

    out: dict = {"eager": {str(b): hf_decode(hf, b, cfg.prompt_len, cfg.hf_new_tokens, vocab)
                           for b in cfg.hf_batch_sizes}}
    out["prefill"] = hf_ttft(hf, cfg.prefill_len, vocab)
    if cfg.hf_compile:
        try:
            out["static_compile_b1"] = hf_compiled_decode(hf, 1, cfg.prompt_len,
                                                          cfg.hf_new_tokens, vocab)
        except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
            out["static_compile_b1"] = {"error": repr(e)[:500]}
    return out
