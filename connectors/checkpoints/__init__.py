"""Real VLM checkpoints: an HF Idefics3, SmolVLM or LLaVA directory served by mmserve.

The LM goes to mmserve's own Llama family (``mmserve.models.vlm_text`` maps its names);
the vision tower and projector become a connector here:

- ``idefics3`` / ``smolvlm`` (``Idefics3Connector``): SigLIP tiles + a global frame, pixel
  shuffle, one linear layer; ``<fake_token_around_image>`` / ``<row_i_col_j>`` /
  ``<global-img>`` layout.
- ``llava`` (``LlavaConnector``): a CLIP or SigLIP tower read at ``vision_feature_layer``,
  ``mlp2x_gelu``; ``<image>`` repeated per patch.

Towers are timm ViTs holding the HF weights (``towers``); preprocessing reproduces the HF
image processors pixel for pixel (``preprocess``); prompts are laid out and tokenized as the
HF processors do it (``processor``, an ``ImageProcessor``; each connector is a
``Connector``). ``tests/connectors/test_vlm_checkpoints.py`` holds each family to HF
transformers: the same pixels, prompt ids, features, logits and greedy tokens from the same
saved directory.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from connectors.checkpoints import idefics3, llava
from connectors.checkpoints.files import ProcessorFiles, read_processor_files
from connectors.checkpoints.idefics3 import MODEL_TYPES as IDEFICS3_TYPES
from connectors.checkpoints.idefics3 import Idefics3Connector
from connectors.checkpoints.llava import MODEL_TYPES as LLAVA_TYPES
from connectors.checkpoints.llava import LlavaConnector
from connectors.checkpoints.processor import CheckpointProcessor
from mmserve.models.tokenizer import Tokenizer

MODEL_TYPES = IDEFICS3_TYPES + LLAVA_TYPES
CheckpointConnector = Idefics3Connector | LlavaConnector

__all__ = [
    "MODEL_TYPES",
    "CheckpointConnector",
    "CheckpointProcessor",
    "Idefics3Connector",
    "LlavaConnector",
    "ProcessorFiles",
    "is_vlm_checkpoint",
    "is_vlm_dir",
    "load_connector",
    "load_processor",
    "read_processor_files",
]


def is_vlm_checkpoint(config: dict[str, Any]) -> bool:
    """Whether an HF ``config.json`` dict is one of the VLM families served here."""
    return config.get("model_type") in MODEL_TYPES


def is_vlm_dir(path: str | Path) -> bool:
    """Whether ``path`` is a model directory holding one of these VLM checkpoints."""
    from mmserve.models.weights import load_config

    return (Path(path) / "config.json").is_file() and is_vlm_checkpoint(load_config(path))


def _family(model_dir: str | Path) -> tuple[dict[str, Any], ModuleType]:
    from mmserve.models.weights import load_config

    config = load_config(model_dir)
    if not is_vlm_checkpoint(config):
        raise ValueError(
            f"{model_dir} is a {config.get('model_type')!r} checkpoint; VLM "
            f"checkpoints served here: {', '.join(MODEL_TYPES)}"
        )
    return config, idefics3 if config["model_type"] in IDEFICS3_TYPES else llava


def load_processor(
    model_dir: str | Path, tokenizer: Tokenizer | None = None
) -> CheckpointProcessor:
    """The CPU half of the checkpoint in ``model_dir`` (config and processor files only)."""
    config, family = _family(model_dir)
    return family.checkpoint_processor(
        config, read_processor_files(model_dir), tokenizer or Tokenizer(model_dir)
    )


def load_connector(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    tokenizer: Tokenizer | None = None,
) -> CheckpointConnector:
    """The vision side of the checkpoint in ``model_dir`` (only its tensors are read)."""
    from mmserve.models.vlm_text import is_text_tensor
    from mmserve.models.weights import load_state_dict

    config, family = _family(model_dir)
    sd = load_state_dict(model_dir, names=lambda name: not is_text_tensor(config, name))
    cls = family.Idefics3Connector if family is idefics3 else family.LlavaConnector
    connector = cls.from_checkpoint(
        config, read_processor_files(model_dir), sd, tokenizer or Tokenizer(model_dir)
    )
    return connector.to(device=device, dtype=dtype)
