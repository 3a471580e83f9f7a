"""Pretraining the offline default's vision encoder on generated images.

No pretrained vision encoder can be fetched here, so the default builds its own: a
small timm ViT learns to classify what ``connectors.synthetic`` draws (colour,
shape, count, position, rendered word), from average-pooled patch tokens, so the
patch tokens themselves (what the connector reads) carry the attributes. Then it
is frozen for good.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from connectors import synthetic
from connectors.encoder import Preprocess


@dataclass
class PretrainResult:
    steps: int
    val_accuracy: dict[str, float]  # per attribute, on the generator's "val" split


class Heads(nn.Module):
    """One linear classifier per attribute on pooled features."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.heads = nn.ModuleDict({k: nn.Linear(dim, n) for k, n in synthetic.HEADS.items()})

    def forward(self, pooled: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: h(pooled) for k, h in self.heads.items()}


def batch(
    split: str, start: int, n: int, preprocess: Preprocess, size: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Images ``start .. start + n`` of ``split`` -> pixels (n, 3, H, W) and labels."""
    pixels, labels = [], []
    for i in range(start, start + n):
        img, scene = synthetic.sample(split, i, size)
        pixels.append(preprocess(img))
        labels.append(scene.labels())
    return torch.stack(pixels), {
        k: torch.tensor([lab[k] for lab in labels]) for k in synthetic.HEADS
    }


def pooled(model: Any, pixels: torch.Tensor) -> torch.Tensor:
    feats = model.forward_features(pixels)  # (B, prefix + N, C)
    return feats[:, int(getattr(model, "num_prefix_tokens", 0)) :].mean(1)


class Pool:
    """``n`` generated images held as uint8 (made once, in ``workers`` processes);
    batches are seeded draws from it (a GPU outruns one core drawing shapes)."""

    def __init__(
        self, n: int, preprocess: Preprocess, image_size: int, workers: int, device: torch.device
    ) -> None:
        arr, scenes = synthetic.generate("train", 0, n, image_size, workers)
        self.images = torch.from_numpy(arr).to(device)
        self.labels = {
            k: torch.tensor([s.labels()[k] for s in scenes], device=device) for k in synthetic.HEADS
        }
        self.preprocess, self.n = preprocess, n

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        g = torch.Generator().manual_seed(step)
        idx = torch.randint(0, self.n, (size,), generator=g).to(self.images.device)
        return (
            self.preprocess.normalize_uint8(self.images[idx]),
            {k: v[idx] for k, v in self.labels.items()},
        )


def pretrain_encoder(
    model: Any,
    preprocess: Preprocess,
    steps: int,
    batch_size: int,
    lr: float,
    device: torch.device,
    image_size: int,
    progress: bool = True,
    pool: int | None = None,
    workers: int = 1,
    eval_every: int = 0,
    log: Callable[[dict], None] | None = None,
) -> PretrainResult:
    """Train ``model`` (in place) with classification heads; -> val accuracy. Batches are
    fresh images (``pool`` None: image ``i`` is seen once) or draws from ``pool`` images."""
    model.to(device).train()
    heads = Heads(int(model.num_features)).to(device)
    params = list(model.parameters()) + list(heads.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.05)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))),
    )
    bar = tqdm(range(steps), desc="pretrain encoder", disable=not progress, unit="step")
    amp = device.type == "cuda"
    source = Pool(pool, preprocess, image_size, workers, device) if pool else None
    for step in bar:
        if source is not None:
            pixels, labels = source.batch(step, batch_size)
        else:
            pixels, labels = batch("train", step * batch_size, batch_size, preprocess, image_size)
        with torch.autocast(device.type, torch.bfloat16, enabled=amp):
            logits = heads(pooled(model, pixels.to(device)))
            loss = sum(
                nn.functional.cross_entropy(logits[k].float(), labels[k].to(device)) for k in logits
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[union-attr]
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}")  # type: ignore[union-attr]
        if log is not None and eval_every and (step + 1) % eval_every == 0:
            model.eval()
            log(
                {
                    "step": step + 1,
                    "val_accuracy": evaluate(model, heads, preprocess, device, image_size, 256),
                }
            )
            model.train()
    model.eval()
    return PretrainResult(steps, evaluate(model, heads, preprocess, device, image_size))


@torch.no_grad()
def evaluate(
    model: Any,
    heads: Heads,
    preprocess: Preprocess,
    device: torch.device,
    image_size: int,
    n: int = 512,
) -> dict[str, float]:
    pixels, labels = batch("val", 0, n, preprocess, image_size)
    logits = heads(pooled(model, pixels.to(device)).float())
    return {k: float((logits[k].argmax(-1).cpu() == labels[k]).float().mean()) for k in logits}
