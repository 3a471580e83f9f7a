"""The language model inside an HF vision-language checkpoint, as a plain LM checkpoint.

Idefics3, SmolVLM and LLaVA directories hold one ``config.json`` (the LM's under
``text_config``) and one set of safetensors (the LM's tensors under a prefix). This module
turns them into what ``registry.build_model`` takes for a text-only model; the vision tower
and projector are ``connectors.checkpoints``' concern.

Tensor prefixes:
- Idefics3 / SmolVLM: ``model.text_model.*`` and ``lm_head.*``.
- LLaVA, transformers >= 4.52 layout: ``model.language_model.*`` and ``lm_head.*``; the
  older layout most hub checkpoints still have: ``language_model.model.*`` and
  ``language_model.lm_head.*``.

Tied embeddings follow transformers: the top-level ``tie_word_embeddings`` decides
(LLaVA also takes ``text_config``'s when the top level says no). A ``text_config``
written as a diff against ``LlamaConfig`` (older saves) gets its defaults back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

VLM_TYPES = ("idefics3", "smolvlm", "llava")

# LlamaConfig's defaults, for text_configs saved as a diff against them (RoPE's theta
# defaults where it is read, ``llama.rope_settings``: it may sit in ``rope_parameters``)
_LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
}

# checkpoint prefix -> text-only prefix, first match wins
_RENAMES = {
    "idefics3": (("model.text_model.", "model."), ("lm_head.", "lm_head.")),
    "smolvlm": (("model.text_model.", "model."), ("lm_head.", "lm_head.")),
    "llava": (
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
        ("lm_head.", "lm_head."),
    ),
}


def is_vlm(config: Mapping[str, Any]) -> bool:
    return config.get("model_type") in VLM_TYPES


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The LM's config: ``text_config`` with defaults filled and the tying rule applied."""
    text = dict(config.get("text_config") or {})
    text.setdefault("model_type", "llama")
    if text["model_type"] == "llama":
        defaults = dict(_LLAMA_DEFAULTS)
        if config["model_type"] in ("idefics3", "smolvlm"):
            defaults["rms_norm_eps"] = 1e-5  # their text_config default
        text = defaults | text
    tie = bool(config.get("tie_word_embeddings", False))
    if config["model_type"] == "llava":
        tie = tie or bool(text.get("tie_word_embeddings", False))
    text["tie_word_embeddings"] = tie
    return text


def text_weights(
    config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The LM's tensors under text-only names (``model.layers.0...``, ``lm_head.weight``);
    the vision tower's and projector's are left out."""
    renames = _RENAMES[config["model_type"]]
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        for src, dst in renames:
            if name.startswith(src):
                out[dst + name[len(src) :]] = tensor
                break
    if "model.embed_tokens.weight" not in out:
        raise ValueError(
            f"no language-model tensors found in this {config['model_type']} "
            f"checkpoint (looked for {', '.join(s for s, _ in renames)})"
        )
    return out


def is_text_tensor(config: Mapping[str, Any], name: str) -> bool:
    """Whether ``name`` belongs to the LM (for loading only the LM's tensors)."""
    return any(name.startswith(src) for src, _ in _RENAMES[config["model_type"]])
