"""Native Llama-family models against HF transformers' own implementation (random weights).

Tiny random configs cover each family's differences (GQA, QKV bias, q/k norm,
untied head, RoPE scaling); the real-model parity test lives in test_parity.py.
"""

import pytest
import torch
import transformers

from mmserve.models.harness import SequenceRunner
from mmserve.models.registry import build_model

BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)

CASES = {
    "llama": (
        transformers.LlamaConfig,
        dict(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ),
    "smollm2_tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True)),
    "qwen2": (transformers.Qwen2Config, dict()),
    "qwen3": (transformers.Qwen3Config, dict(head_dim=32)),
    "mistral": (transformers.MistralConfig, dict(sliding_window=None)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf(case):
    cls, extra = CASES[case]
    torch.manual_seed(0)
    cfg = cls(**{**BASE, **extra})
    cfg._attn_implementation = "eager"
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():  # norms are ones at init; randomize so they matter
            p.normal_(0, 0.2)
    model = build_model(cfg.to_dict(), hf.state_dict())
    ids = torch.randint(0, 300, (1, 40))
    with torch.no_grad():
        want = hf(ids).logits[0]
    runner = SequenceRunner(model, max_len=64)
    got = torch.cat([runner.step(ids[0, :25].tolist(), 0), runner.step(ids[0, 25:].tolist(), 25)])
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
