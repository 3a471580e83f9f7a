"""Building an engine from an ``EngineConfig``: device, dtype, weights, tokenizer, KV pool."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import torch

from mmserve.config import DEFAULT_MODEL, EngineConfig
from mmserve.engine.engine import LLMEngine
from mmserve.kernels import settings
from mmserve.speculative.factory import build_speculator

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_LEN_CAP = 8192


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device; use cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def model_name(config: EngineConfig) -> str:
    """The name the server advertises: the registry name, or the path's last component."""
    name = config.model or DEFAULT_MODEL
    return Path(name).name if ("/" in name or name.endswith(".gguf")) else name


def create_engine(config: EngineConfig) -> LLMEngine:
    from mmserve.kernels.triton_matmul import Q8_MAX_ROWS
    from mmserve.models.hub import resolve_model
    from mmserve.models.registry import load_model
    from mmserve.models.tokenizer import Tokenizer

    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    # the kernels' settings in force, with this engine's arithmetic (batch invariance)
    kernels = dataclasses.replace(settings.current(), batch_invariant=config.batch_invariant)
    settings.install(kernels)
    torch.manual_seed(config.seed)
    start = time.perf_counter()
    path = resolve_model(config.model)
    model = load_model(path, dtype, device)
    tokenizer = Tokenizer(path)
    log.info("loaded %s from %s in %.2fs", model_name(config), path, time.perf_counter() - start)
    head = model.q8_head()
    if head is not None and kernels.q8_head:
        log.info(
            "LM head: read from its Q8_0 blocks up to %d rows (%.1f MB against %.1f MB "
            "of %s; the same bits)",
            Q8_MAX_ROWS,
            sum(t.numel() * t.element_size() for t in head) / 1e6,
            model.lm_head_weight().numel() * model.lm_head_weight().element_size() / 1e6,
            str(dtype).removeprefix("torch."),
        )
    elif head is not None:
        log.info(
            "LM head: from its %s weight (its Q8_0 blocks unread: MMSERVE_Q8_HEAD=0)",
            str(dtype).removeprefix("torch."),
        )
    limit = config.max_model_len or min(model.max_position_embeddings, DEFAULT_MAX_LEN_CAP)
    if limit > model.max_position_embeddings:
        raise ValueError(
            f"max_model_len {limit} exceeds the model's context of "
            f"{model.max_position_embeddings} tokens"
        )
    engine = LLMEngine(
        config,
        model,
        tokenizer,
        limit,
        device,
        dtype,
        build_speculator(config.spec_config(), model, device, dtype),
    )
    attach_connector(engine, config, path)
    if config.warmup and device.type == "cuda":
        from mmserve.engine.warmup import warm_up

        warm_up(engine)
        if engine.connector is not None:
            engine.connector.warm_up()
    return engine


def attach_connector(engine: LLMEngine, config: EngineConfig, model_path: Path) -> None:
    """Load the connector ``config.connector`` names (if any) as the engine's span encoder."""
    from connectors.loader import load_connector, resolve_connector

    where = resolve_connector(config.connector, model_name(config), model_path)
    if where is None:
        return
    start = time.perf_counter()
    connector = load_connector(where, engine.tokenizer, engine.device, engine.dtype)
    engine.set_span_encoder(connector)
    engine.connector = connector
    log.info("loaded vision connector %s in %.2fs", where, time.perf_counter() - start)
