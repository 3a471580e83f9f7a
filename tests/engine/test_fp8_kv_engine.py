"""The fp8 KV cache on the real default model: teacher-forced logits against the
full-precision cache, generation end to end (batch invariance, preemption, prefix cache,
no leaked blocks), the memory budget, and the option's validation.

The bounds were measured on CPU (float32 model, so "auto" is a float32 cache): the CPU
tests pin ``device="cpu"`` so that they hold on a GPU machine too.
"""

from __future__ import annotations

import pytest
import torch

from mmserve import LLM, SamplingParams
from mmserve.cli import build_parser, config_from
from mmserve.config import EngineConfig
from mmserve.engine.kv_cache import KVCache
from mmserve.kernels.attention import AttentionMetadata
from mmserve.kernels.fp8 import FP8_DTYPE

LONG_PROMPTS = [  # ~80-100 tokens each; the continuation adds 48 more
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker named Elias. Every morning he opened his shop, wound every clock on the walls, "
    "and listened to them tick together. One winter day a young girl came in carrying a broken "
    "pocket watch that had belonged to her grandmother. She asked him whether he could repair "
    "it before the festival. Elias looked at the watch and said",
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg, a goldsmith from Mainz, combined several existing technologies into a system "
    "for mass-producing books. Before him, texts were copied by hand or printed from carved "
    "wooden blocks, which was slow and costly. His movable metal type, oil-based ink and a "
    "wooden screw press changed how knowledge spread across Europe. Explain in detail",
    'def merge_sort(items):\n    """Sort a list of numbers with merge sort."""\n'
    "    if len(items) <= 1:\n        return list(items)\n    middle = len(items) // 2\n"
    "    left = merge_sort(items[:middle])\n    right = merge_sort(items[middle:])\n"
    "    result = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n",
]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "1, 2, 3, 4,",
    "import numpy as np\n",
    "Q: What is 7 times 8?\nA:",
]
GREEDY = SamplingParams(temperature=0, max_tokens=12)

# Teacher-forced bounds, fp8 vs float32 cache, measured over LONG_PROMPTS + 48 greedy
# tokens each (404 positions): max |logit diff| 2.1-2.8 per prompt (logits span about
# +-40), KL mean 0.0034-0.0046 and max 0.048 nats, top-1 agreement 0.977-0.993 per prompt
# (0.95 on a variant prompt). A bf16 cache: max diff 0.22, KL mean 2e-5, top-1 1.0. The
# bounds leave about 2x headroom (top-1: 4x the measured disagreement).
MAX_LOGIT_DIFF = 5.0
MAX_KL_MEAN = 0.01
MAX_KL = 0.1
MIN_TOP1 = 0.90


@pytest.fixture(scope="module")
def llm(default_model_dir):
    return LLM(str(default_model_dir), device="cpu", kv_cache_memory_mb=64)


@pytest.fixture(scope="module")
def fp8_llm(default_model_dir):
    return LLM(
        str(default_model_dir), device="cpu", kv_cache_memory_mb=64, kv_cache_dtype="fp8_e4m3"
    )


@pytest.fixture(scope="module")
def fp8_alone(fp8_llm):
    return [fp8_llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


def _teacher_forced_logits(model, ids: list[int], kv_dtype: torch.dtype) -> torch.Tensor:
    """(len(ids), V) next-token logits of one prefill over ``ids`` with a fresh cache."""
    bs, n = 16, len(ids)
    blocks = -(-n // bs)
    device = model.embed_tokens.weight.device
    kv = KVCache(model.num_layers, blocks, bs, model.num_kv_heads, model.head_dim, kv_dtype, device)
    meta = AttentionMetadata.build([n], [n], [list(range(blocks))], bs, device)
    with torch.no_grad():
        hidden = model(torch.tensor(ids, device=device), torch.arange(n, device=device), meta, kv)
        return model.compute_logits(hidden)


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row, in nats."""
    lp, lq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1)


def test_teacher_forced_logits_bounded_against_full_precision(llm):
    """The same tokens (prompt + the full-precision greedy continuation) through both caches."""
    model, dtype = llm.engine.model, llm.engine.kv.dtype
    prompts = [llm.tokenizer.encode(p, add_special_tokens=True) for p in LONG_PROMPTS]
    greedy = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    conts = [r.token_ids for r in llm.generate(prompts, greedy)]  # batched == alone
    diffs, kls, kls16, agree = [], [], [], []
    for prompt, ids, cont in zip(LONG_PROMPTS, prompts, conts, strict=True):
        seq = ids + cont
        full = _teacher_forced_logits(model, seq, dtype)
        # the harness is the engine's computation: its argmax is the greedy continuation
        assert full[len(ids) - 1 : -1].argmax(-1).tolist() == cont
        fp8 = _teacher_forced_logits(model, seq, FP8_DTYPE)
        bf16 = _teacher_forced_logits(model, seq, torch.bfloat16)
        diffs.append((fp8 - full).abs().amax(-1))
        kls.append(_kl(full, fp8))
        kls16.append(_kl(full, bf16))
        top1 = (fp8.argmax(-1) == full.argmax(-1)).float().mean().item()
        agree.append(top1)
        assert top1 >= MIN_TOP1, (prompt[:20], top1)
    diff, kl, kl16 = torch.cat(diffs), torch.cat(kls), torch.cat(kls16)
    assert diff.max() < MAX_LOGIT_DIFF, diff.max()
    assert kl.mean() < MAX_KL_MEAN and kl.max() < MAX_KL, (kl.mean(), kl.max())
    assert diff.max() > 0.05 and kl.mean() > 10 * kl16.mean()  # fp8 really ran, and costs more
    assert sum(agree) / len(agree) >= MIN_TOP1 + 0.03, agree


def test_generate_end_to_end_batch_invariant_and_frees_blocks(fp8_llm, fp8_alone):
    eng = fp8_llm.engine
    assert eng.kv.dtype == FP8_DTYPE and eng.kv.scales is not None
    assert eng.kv.scales.count_nonzero() > 0  # written through the fp8 path
    together = fp8_llm.generate(PROMPTS, GREEDY)
    assert [r.token_ids for r in together] == fp8_alone
    assert all(r.finish_reason in ("length", "stop") and r.text for r in together)
    assert eng.blocks.num_used_blocks == 0


def test_fp8_greedy_mostly_agrees_with_full_precision(llm, fp8_alone):
    full = [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]
    # measured: all 6 agree on the first 8 tokens, 5 on all 12
    same_start = sum(a[:8] == b[:8] for a, b in zip(full, fp8_alone, strict=True))
    assert same_start >= len(PROMPTS) - 1, (full, fp8_alone)


def test_preemption_and_prefix_cache_keep_fp8_outputs(default_model_dir, fp8_alone):
    small = LLM(
        str(default_model_dir),
        device="cpu",
        num_kv_blocks=6,
        enable_prefix_caching=False,
        kv_cache_dtype="fp8",
    )
    out = small.generate(PROMPTS, GREEDY)
    assert small.engine.scheduler.num_preemptions > 0
    assert [r.token_ids for r in out] == fp8_alone
    assert small.engine.blocks.num_used_blocks == 0
    cached = LLM(str(default_model_dir), device="cpu", num_kv_blocks=64, kv_cache_dtype="fp8")
    shared = "You are a helpful assistant. Answer briefly and precisely. " * 4
    first = cached.generate(shared + "What is the capital of Italy?", GREEDY)[0]
    hits = cached.engine.blocks.prefix_hits
    second = cached.generate(shared + "What is the capital of Italy?", GREEDY)[0]
    assert cached.engine.blocks.prefix_hits - hits >= 32  # shared blocks carry their scales
    assert second.token_ids == first.token_ids
    assert cached.engine.blocks.num_used_blocks == 0


def test_memory_budget_holds_more_fp8_blocks(default_model_dir):
    full = LLM(str(default_model_dir), device="cpu", kv_cache_memory_mb=8).engine
    fp8 = LLM(
        str(default_model_dir), device="cpu", kv_cache_memory_mb=8, kv_cache_dtype="fp8_e4m3"
    ).engine
    m = fp8.model
    per_block = KVCache.bytes_per_block(m.num_layers, 16, m.num_kv_heads, m.head_dim, FP8_DTYPE)
    assert fp8.kv.num_blocks == (8 << 20) // per_block
    assert fp8.kv.nbytes <= 8 << 20 and full.kv.dtype == torch.float32
    ideal = 4 * m.head_dim / (m.head_dim + 4)  # float32 vs e4m3 + a float32 scale per vector
    assert fp8.kv.num_blocks >= 0.9 * ideal * full.kv.num_blocks, (
        fp8.kv.num_blocks,
        full.kv.num_blocks,
    )


def test_option_validated_and_on_the_cli():
    assert EngineConfig(kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8_e4m3, fp8"):
        EngineConfig(kv_cache_dtype="int8")
    args = build_parser().parse_args(["serve", "--kv-cache-dtype", "fp8_e4m3"])
    assert config_from(EngineConfig, args).kv_cache_dtype == "fp8_e4m3"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fp8_generate_batch_invariant_and_frees_blocks(default_model_dir):
    """On CUDA: Triton writer + kernel, CUDA graphs; batched equals alone, nothing leaked."""
    gpu = LLM(
        str(default_model_dir), device="cuda", kv_cache_memory_mb=256, kv_cache_dtype="fp8_e4m3"
    )
    assert gpu.engine.kv.dtype == FP8_DTYPE
    alone = [gpu.generate(p, GREEDY)[0].token_ids for p in PROMPTS]
    together = gpu.generate(PROMPTS, GREEDY)
    assert [r.token_ids for r in together] == alone
    assert gpu.engine.blocks.num_used_blocks == 0
    model = gpu.engine.model
    ids = gpu.tokenizer.encode(LONG_PROMPTS[0], add_special_tokens=True)
    full = _teacher_forced_logits(model, ids, gpu.engine.model.embed_tokens.weight.dtype)
    fp8 = _teacher_forced_logits(model, ids, FP8_DTYPE)
    top1 = (fp8.argmax(-1) == full.argmax(-1)).float().mean().item()
    assert top1 >= MIN_TOP1 - 0.05 and _kl(full, fp8).mean() < 2 * MAX_KL_MEAN
