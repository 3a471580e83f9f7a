"""The baseline in the same run: HF transformers on the same shape and weights.

Eager ``generate`` (dynamic cache, SDPA), greedy, EOS disabled so every row makes
the full count; optionally a static cache with ``torch.compile`` (minutes of
compile time, so off unless asked for).
"""

from __future__ import annotations

import statistics
import time

import torch


def build_hf_model(config: dict, dtype: torch.dtype = torch.bfloat16):
    """Random-weight ``LlamaForCausalLM`` built directly on the GPU (no CPU init pass)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{k: v for k, v in config.items() if k != "model_type"})
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def _generate(model, ids: torch.Tensor, new: int, **extra) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            **extra,
        )
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def hf_decode(model, batch: int, prompt_len: int, new_tokens: int, vocab: int, **extra) -> dict:
    """Decode tok/s from two generates: (T(new) - T(1)) covers new - 1 decode steps."""
    ids = torch.randint(0, vocab, (batch, prompt_len), device="cuda")
    _generate(model, ids, 2, **extra)  # warm-up
    t1 = _generate(model, ids, 1, **extra)
    tn = _generate(model, ids, new_tokens, **extra)
    steps = new_tokens - 1
    return {
        "batch": batch,
        "steps": steps,
        "seconds": tn - t1,
        "tok_s": batch * steps / (tn - t1),
        "step_ms": (tn - t1) / steps * 1e3,
    }


def hf_ttft(model, prompt_len: int, vocab: int, repeats: int = 3) -> dict:
    """One forward over the prompt, last row's logits, id to the host."""
    ids = torch.randint(0, vocab, (1, prompt_len), device="cuda")
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            int(out.logits[0, -1].argmax())
            if i:  # the first is warm-up
                times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    return {"prompt_len": prompt_len, "ttft_ms": s * 1e3, "prefill_tok_s": prompt_len / s}


def hf_compiled_decode(model, batch: int, prompt_len: int, new_tokens: int, vocab: int) -> dict:
    """Static cache + ``torch.compile`` (reduce-overhead); includes no compile time."""
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    try:
        return hf_decode(model, batch, prompt_len, new_tokens, vocab, cache_implementation="static")
    finally:
        del model.forward  # back to the class's eager forward
