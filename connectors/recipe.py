"""The offline default connector, end to end, from nothing but this repository:

1. a small timm ViT (64x64 images, 8x8 patches, width 128, 4 blocks) pretrained on
   generated images (``pretrain``), then frozen;
2. its 8x8 patch grid pixel-shuffled by 4 into 4 image tokens, a LayerNorm + MLP
   projector trained into SmolLM2-135M-Instruct's embedding space with the LM frozen
   (``train``), on generated images and their templated captions;
3. held-out captions scored (``evaluate``).

``mmserve connector recipe --out DIR`` runs it. ``--preset cpu`` made the shipped
default on a shared 2-core machine (about 75 minutes, single-threaded); ``--preset gpu``
is the same recipe with more images and steps for one GPU run of a few minutes.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

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

log = logging.getLogger(__name__)

IMAGE_SIZE = 64
ENCODER = EncoderSpec(
    "vit_tiny_patch16_224",
    dict(
        img_size=IMAGE_SIZE,
        patch_size=8,
        embed_dim=128,
        depth=4,
        num_heads=4,
        class_token=False,
        global_pool="avg",
    ),
    None,
    dict(
        input_size=(3, IMAGE_SIZE, IMAGE_SIZE),
        crop_pct=1.0,
        crop_mode="squash",
        interpolation="bicubic",
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
    ),
)
GRID = (8, 8)
SCALE = 4  # 8x8 patches -> 2x2 = 4 image tokens


@dataclass(frozen=True)
class Preset:
    pretrain_steps: int
    pretrain_batch: int
    pretrain_pool: int | None  # None: fresh images every step; else draws from this many
    images: int  # generated training pairs for the connector
    steps: int
    batch_size: int
    lr: float


PRESETS = {
    "cpu": Preset(
        pretrain_steps=1500,
        pretrain_batch=64,
        pretrain_pool=30_000,
        images=6000,
        steps=800,
        batch_size=8,
        lr=2e-3,
    ),
    "gpu": Preset(
        pretrain_steps=3000,
        pretrain_batch=256,
        pretrain_pool=100_000,
        images=20_000,
        steps=1500,
        batch_size=32,
        lr=2e-3,
    ),
    "tiny": Preset(
        pretrain_steps=2,
        pretrain_batch=8,
        pretrain_pool=None,
        images=16,
        steps=2,
        batch_size=4,
        lr=1e-3,
    ),  # plumbing only (tests)
}


def _log(path: Path, record: dict, model: torch.nn.Module) -> None:
    """A pretraining evaluation: appended to ``path``, the encoder saved beside it."""
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    torch.save(model.state_dict(), path.with_name("encoder_pretrained.pt"))


def _workers(dev: torch.device) -> int:
    """Processes drawing generated images: all cores beside a GPU, one on a CPU run."""
    return max(1, min(16, os.cpu_count() or 1)) if dev.type == "cuda" else 1


def connector_config(hidden: int, lm: str | None) -> ConnectorConfig:
    return ConnectorConfig(ENCODER, ProjectorSpec("shuffle_mlp", 128, hidden, SCALE), GRID, lm=lm)


def build_encoder(weights: str | None) -> tuple[torch.nn.Module, Preprocess]:
    spec = EncoderSpec(ENCODER.name, ENCODER.kwargs, weights, ENCODER.data)
    model = create_encoder_model(spec)
    return model, Preprocess(data_config(model, spec))


def run_recipe(
    out: str,
    preset: str = "cpu",
    lm: str | None = None,
    device: str = "auto",
    encoder_weights: str | None = None,
    eval_images: int = 200,
    progress: bool = True,
    work_dir: str | None = None,
) -> dict:
    """Pretrain (unless ``encoder_weights``), train, save to ``out``, evaluate -> report."""
    from mmserve.engine.factory import resolve_device

    p = PRESETS[preset]
    dev = resolve_device(device)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, preprocess = build_encoder(encoder_weights)
    report: dict = {"preset": preset, "device": str(dev)}
    if encoder_weights is None:
        from connectors.pretrain import pretrain_encoder

        res = pretrain_encoder(
            model,
            preprocess,
            p.pretrain_steps,
            p.pretrain_batch,
            1e-3,
            dev,
            IMAGE_SIZE,
            progress,
            p.pretrain_pool,
            _workers(dev),
            eval_every=max(1, p.pretrain_steps // 8),
            log=lambda r: _log(out_dir / "pretrain_log.jsonl", r, model),
        )
        report["encoder_val_accuracy"] = res.val_accuracy
        torch.save(model.state_dict(), out_dir / "encoder_pretrained.pt")
        log.info("encoder pretrained: %s", res.val_accuracy)
    report["train"] = train_default(
        out_dir,
        model,
        preprocess,
        p,
        lm,
        dev,
        progress,
        work_dir,
        {
            "preset": preset,
            "command": f"mmserve connector recipe --preset {preset} --device {dev.type} --out DIR",
        },
    )
    from connectors.evaluate import evaluate_connector

    report["eval"] = evaluate_connector(str(out_dir), lm, eval_images, device=device)
    (out_dir / "recipe.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def train_default(
    out_dir: Path,
    model: torch.nn.Module,
    preprocess: Preprocess,
    p: Preset,
    lm: str | None,
    dev: torch.device,
    progress: bool,
    work_dir: str | None = None,
    provenance: dict | None = None,
) -> dict:
    from connectors.train import TrainConfig, Trainer, load_hf_lm

    hf_lm, tokenizer, name = load_hf_lm(lm, dev)
    cfg = connector_config(hf_lm.config.hidden_size, name)
    cfg.extra["recipe"] = provenance or {}
    tcfg = TrainConfig(
        str(out_dir), f"synthetic:{p.images}", p.steps, p.batch_size, p.lr, work_dir=work_dir
    )
    trainer = Trainer(
        tcfg, cfg, TimmEncoder(model), Projector(cfg.projector), hf_lm, tokenizer, dev, progress
    )
    result = trainer.run(trainer.features(preprocess, _workers(dev)))
    trainer.save(result)
    return {"steps": result.steps, "final_loss": result.final_loss, "seconds": result.seconds}
