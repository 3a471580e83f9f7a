"""Real VLM checkpoints: an HF Idefics3, SmolVLM or LLaVA directory served by mmserve.

The LM goes to mmserve's own Llama family (``mmserve.models.vlm_text`` maps its names);
the vision tower and projector become a connector here:

- ``idefics3`` / ``smolvlm`` (``Idefics3Connector``): SigLIP tiles + a global frame, pixel
  shuffle, one linear layer; ``<fake_token_around_image>`` / ``<row_i_col_j>`` /
  ``<global-img>`` layout.
- ``llava`` (``LlavaConnector``): a CLIP or SigLIP tower read at ``vision_feature_layer``,
  ``mlp2x_gelu``; ``<image>`` repeated per patch.

Towers are timm ViTs holding the HF weights (``towers``); preprocessing reproduces the HF
image processors pixel for pixel (``preprocess``); prompts are laid out as the HF processors
lay them out (``prompt``). ``tests/connectors/test_checkpoints.py`` holds each family to HF
transformers: the same pixels, features and greedy tokens from the same saved directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from connectors.checkpoints.files import ProcessorFiles, read_processor_files
from connectors.checkpoints.idefics3 import MODEL_TYPES as IDEFICS3_TYPES
from connectors.checkpoints.idefics3 import Idefics3Connector
from connectors.checkpoints.llava import MODEL_TYPES as LLAVA_TYPES
from connectors.checkpoints.llava import LlavaConnector

MODEL_TYPES = IDEFICS3_TYPES + LLAVA_TYPES
CheckpointConnector = Idefics3Connector | LlavaConnector

__all__ = ["MODEL_TYPES", "CheckpointConnector", "Idefics3Connector", "LlavaConnector",
           "ProcessorFiles", "is_vlm_checkpoint", "load_connector", "read_processor_files"]


def is_vlm_checkpoint(config: dict[str, Any]) -> bool:
    """Whether an HF ``config.json`` dict is one of the VLM families served here."""
    return config.get("model_type") in MODEL_TYPES


def load_connector(model_dir: str | Path, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32) -> CheckpointConnector:
    """The vision side of the VLM checkpoint in ``model_dir`` (only its tensors are read)."""
    from mmserve.models.vlm_text import is_text_tensor
    from mmserve.models.weights import load_config, load_state_dict

    config = load_config(model_dir)
    if not is_vlm_checkpoint(config):
        raise ValueError(f"{model_dir} is a {config.get('model_type')!r} checkpoint; VLM "
                         f"checkpoints served here: {', '.join(MODEL_TYPES)}")
    files = read_processor_files(model_dir)
    sd = load_state_dict(model_dir, names=lambda name: not is_text_tensor(config, name))
    cls = Idefics3Connector if config["model_type"] in IDEFICS3_TYPES else LlavaConnector
    return cls.from_checkpoint(config, files, sd).to(device=device, dtype=dtype)
