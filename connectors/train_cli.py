"""``mmserve connector train``: a projector for any timm encoder and any served LM."""

from __future__ import annotations

from typing import Any

import torch

from connectors.encoder import (
    EncoderSpec,
    Preprocess,
    TimmEncoder,
    create_encoder_model,
    data_config,
)
from connectors.projector import Projector, ProjectorSpec
from connectors.timm_connector import ConnectorConfig
from connectors.train import TrainConfig, Trainer, load_hf_lm


def probe_grid(encoder: TimmEncoder, preprocess: Preprocess) -> tuple[int, int]:
    """The patch grid the encoder gives for one input-size image."""
    with torch.no_grad():
        grid = encoder(torch.zeros(1, 3, *preprocess.size))
    return int(grid.shape[1]), int(grid.shape[2])


def train_connector(
    out: str,
    name: str,
    file: str | None,
    kwargs: dict[str, Any],
    kind: str,
    scale: int,
    data: str,
    lm: str | None,
    device: str,
    steps: int,
    batch_size: int,
    lr: float,
    save_every: int,
    work_dir: str | None = None,
) -> dict:
    from mmserve.engine.factory import resolve_device

    dev = resolve_device(device)
    spec = EncoderSpec(name, kwargs, file)
    model = create_encoder_model(spec)
    encoder, preprocess = TimmEncoder(model), Preprocess(data_config(model, spec))
    hf_lm, tokenizer, lm_name = load_hf_lm(lm, dev)
    grid = probe_grid(encoder, preprocess)
    cfg = ConnectorConfig(
        EncoderSpec(name, kwargs, None, preprocess.cfg),
        ProjectorSpec(kind, encoder.dim, hf_lm.config.hidden_size, scale),
        grid,
        lm=lm_name,
    )
    trainer = Trainer(
        TrainConfig(out, data, steps, batch_size, lr, save_every=save_every, work_dir=work_dir),
        cfg,
        encoder,
        Projector(cfg.projector),
        hf_lm,
        tokenizer,
        dev,
    )
    result = trainer.run(trainer.features(preprocess))
    trainer.save(result)
    return {
        "out": out,
        "steps": result.steps,
        "final_loss": result.final_loss,
        "resumed_from": result.resumed_from,
        "image_tokens": cfg.tokens_per_tile,
    }
