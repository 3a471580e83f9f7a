"""config.json ``model_type`` -> model family, and building a model from a directory."""

from __future__ import annotations

from pathlib import Path

import torch

from mmserve.models.base import CausalLM


def family(config: dict) -> type[CausalLM]:
    """The model class for an HF config dict; a clear error for unsupported types."""
    from mmserve.models.gemma3 import MODEL_TYPES as GEMMA_TYPES
    from mmserve.models.gemma3 import Gemma3ForCausalLM
    from mmserve.models.llama import MODEL_TYPES as LLAMA_TYPES
    from mmserve.models.llama import LlamaForCausalLM

    kind = config.get("model_type")
    if kind in LLAMA_TYPES:
        return LlamaForCausalLM
    if kind in GEMMA_TYPES:
        return Gemma3ForCausalLM
    raise ValueError(
        f"unsupported model_type {kind!r}; supported: {', '.join(LLAMA_TYPES + GEMMA_TYPES)}"
    )


def text_config(config: dict) -> dict:
    """The LM's config: multimodal Gemma 3 and the VLM checkpoints (``vlm_text``) nest it
    under ``text_config``."""
    from mmserve.models import vlm_text

    if vlm_text.is_vlm(config):
        return vlm_text.text_config(config)
    if config.get("model_type") == "gemma3" and "text_config" in config:
        return {**config["text_config"], "model_type": "gemma3_text"}
    return config


def build_model(
    config: dict,
    state_dict: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> CausalLM:
    from mmserve.models import vlm_text

    if vlm_text.is_vlm(config):
        state_dict = vlm_text.text_weights(config, state_dict)
    config = text_config(config)
    model = family(config).from_hf_config(config)
    model.load_hf_state_dict(state_dict)
    # a GGUF's Q8_0 LM head (both shipped models'), found in the float32 weight: on CUDA in
    # half precision the batch-1 product reads its blocks (kernels/q8.py: the same bits)
    blocks = None
    if torch.device(device).type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        from mmserve.kernels.q8 import factor_q8

        blocks = factor_q8(model.lm_head_weight().detach().to(device))  # there: fast
    model = model.to(device=device, dtype=dtype).eval()
    model.placed()
    if blocks is not None:
        model.attach_q8_head(blocks)
    return model


def load_model(
    model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> CausalLM:
    from mmserve.models import vlm_text
    from mmserve.models.weights import load_config, load_state_dict

    config = load_config(model_dir)
    wanted = (
        (lambda name: vlm_text.is_text_tensor(config, name)) if vlm_text.is_vlm(config) else None
    )
    return build_model(config, load_state_dict(model_dir, names=wanted), dtype, device)
