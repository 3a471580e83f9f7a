"""``mmserve connector train``: teach a projector to speak to a frozen LM (LLaVA stage 1).

Only the projector trains. The encoder and the LM are frozen (``requires_grad`` off,
eval mode; a test holds them bit-identical across training), the encoder's features
are computed once (``train_data.encode_features``), and the loss is the LM's
cross-entropy on the caption tokens (and the end-of-turn token) alone. The chat
template's text before the image is the same for every example, so its KV is
computed once and reused by every step.

Resumable: every ``save_every`` steps ``checkpoint.pt`` (projector, optimizer,
schedule, step) is replaced atomically; a run started on the same ``out`` directory
with the same settings continues where the last one stopped, on the same data order
(batch ``s`` is a function of ``s`` and the seed). The result is a connector
directory (``timm_connector``): config.json, encoder.safetensors,
projector.safetensors.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from tqdm import tqdm

from connectors import synthetic
from connectors.projector import Projector
from connectors.timm_connector import ConnectorConfig, TimmEncoder, save_connector
from connectors.train_data import (
    INSTRUCTIONS,
    Layout,
    Pair,
    encode_features,
    layouts,
    read_pairs,
)

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainConfig:
    out: str  # the connector directory written (and its train_log.jsonl)
    data: str = "synthetic:8000"  # synthetic:N | a JSONL manifest of {"image", "caption"}
    steps: int = 1000
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.0
    save_every: int = 50
    seed: int = 0
    val_examples: int = 32  # generated data: held-out examples scored at each checkpoint
    instructions: tuple[str, ...] = INSTRUCTIONS
    extra: dict[str, Any] = field(default_factory=dict)
    work_dir: str | None = None  # checkpoint and feature cache (None: ``out``)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass
class TrainResult:
    steps: int
    final_loss: float
    seconds: float
    resumed_from: int


M = TypeVar("M", bound=nn.Module)


def freeze(module: M) -> M:
    return module.eval().requires_grad_(False)


class PrefixKV:
    """The KV of the shared prompt prefix, computed once, handed to each step's forward
    as a fresh HF cache expanded to the batch (nothing of it needs a gradient)."""

    def __init__(self, lm: Any, prefix: list[int], device: torch.device) -> None:
        with torch.no_grad():
            out = lm.model(input_ids=torch.tensor([prefix], device=device), use_cache=True)
        self.layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        self.length = len(prefix)

    def cache(self, batch: int) -> Any:
        from transformers import DynamicCache

        c = DynamicCache()
        for i, (k, v) in enumerate(self.layers):
            c.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1), i)
        return c


def batch_indices(step: int, batch: int, n: int, seed: int) -> list[int]:
    """Examples of step ``step``: consecutive slices of a seeded permutation per epoch."""
    out: list[int] = []
    pos = step * batch
    while len(out) < batch:
        epoch, i = divmod(pos, n)
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        perm = torch.randperm(n, generator=g)
        take = min(batch - len(out), n - i)
        out += perm[i : i + take].tolist()
        pos += take
    return out


class Trainer:
    """One training run; built by ``train_connector`` (the CLI) or by tests."""

    def __init__(
        self,
        config: TrainConfig,
        connector: ConnectorConfig,
        encoder: TimmEncoder,
        projector: Projector,
        lm: Any,
        tokenizer: Any,
        device: torch.device,
        progress: bool = True,
    ) -> None:
        self.cfg, self.connector, self.device = config, connector, device
        self.encoder = freeze(encoder)
        self.lm: Any = freeze(lm)
        self.projector = projector.to(device).train()
        self.tokenizer, self.progress = tokenizer, progress
        self.amp = device.type == "cuda"  # bf16 autocast on GPU; fp32 on CPU
        self.layouts = layouts(tokenizer, config.instructions)
        self.end_id = end_of_turn_id(tokenizer)
        self.out = Path(config.out)
        self.work = Path(config.work_dir or config.out)
        for d in (self.out, self.work):
            d.mkdir(parents=True, exist_ok=True)
        self.pairs = read_pairs(config.data)
        self.targets = [
            tokenizer.encode(p.caption, add_special_tokens=False) + [self.end_id]
            for p in self.pairs
        ]
        self.val: tuple[torch.Tensor, list[list[int]]] | None = None  # set by ``features``

    def features(self, preprocess, workers: int = 1) -> torch.Tensor:
        """The training features (encoded once, cached); with generated data, also the
        held-out examples each checkpoint is scored on (``train_log.jsonl``)."""
        if self.cfg.data.startswith("synthetic:") and self.cfg.val_examples:
            pairs = [
                Pair(i, synthetic.scene_of("val", i)[0].caption(), "val")
                for i in range(self.cfg.val_examples)
            ]
            feats = encode_features(
                pairs, self.encoder, preprocess, self.device, None, progress=False
            )
            self.val = (
                feats,
                [
                    self.tokenizer.encode(p.caption, add_special_tokens=False) + [self.end_id]
                    for p in pairs
                ],
            )
        return encode_features(
            self.pairs,
            self.encoder,
            preprocess,
            self.device,
            self.work / "features.safetensors",
            progress=self.progress,
            workers=workers,
        )

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.out / "train_log.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def run(self, feats: torch.Tensor, stop_after: int | None = None) -> TrainResult:
        """Train to ``cfg.steps`` (from the checkpoint, if any); ``stop_after``: return after
        that many steps of this call (a time-boxed run, continued by the next call)."""
        cfg = self.cfg
        params = [p for p in self.projector.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self._lr_factor)
        start = self._resume(opt, sched)
        prefix = PrefixKV(self.lm, self.layouts[0].prefix, self.device)
        embed = self.lm.get_input_embeddings()
        val = self.val
        end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
        bar = tqdm(
            range(start, end),
            desc="train connector",
            unit="step",
            initial=start,
            total=cfg.steps,
            disable=not self.progress,
        )
        t0, loss_v = time.perf_counter(), float("nan")
        for step in bar:
            idx = batch_indices(step, cfg.batch_size, len(self.pairs), cfg.seed)
            loss = self.loss(feats, idx, step, prefix, embed)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            loss_v = float(loss.detach())
            bar.set_postfix(loss=f"{loss_v:.3f}")
            if (step + 1) % cfg.save_every == 0 or step + 1 == end:
                self._checkpoint(opt, sched, step + 1, loss_v)
                self._log(
                    {
                        "step": step + 1,
                        "loss": loss_v,
                        "seconds": time.perf_counter() - t0,
                        **(
                            {f"val_{k}": v for k, v in self.heldout(*val, prefix, embed).items()}
                            if val
                            else {}
                        ),
                    }
                )
        return TrainResult(end, loss_v, time.perf_counter() - t0, start)

    def loss(
        self, feats: torch.Tensor, idx: list[int], step: int, prefix: PrefixKV, embed: Any
    ) -> torch.Tensor:
        """Mean cross-entropy over the caption tokens of examples ``idx``."""
        logits, labels = self._logits(feats[idx], *self._sequences(idx, step), prefix, embed)
        return nn.functional.cross_entropy(logits, labels)

    @torch.no_grad()
    def heldout(
        self, feats: torch.Tensor, targets: list[list[int]], prefix: PrefixKV, embed: Any
    ) -> dict[str, float]:
        """Teacher-forced loss and token accuracy on held-out examples (first layout)."""
        seqs = [self.layouts[0].suffix + t for t in targets]
        logits, labels = self._logits(feats, seqs, targets, prefix, embed)
        return {
            "loss": float(nn.functional.cross_entropy(logits, labels)),
            "token_accuracy": float((logits.argmax(-1) == labels).float().mean()),
        }

    def _logits(
        self,
        grids: torch.Tensor,
        seqs: list[list[int]],
        targets: list[list[int]],
        prefix: PrefixKV,
        embed: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The LM's logits at every target position and the targets, (M, V) and (M,)."""
        grids = grids.to(self.device, torch.float32)  # (B, H, W, C)
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.amp):
            image = self.projector(grids)  # (B, n, D)
            width = max(len(s) for s in seqs)
            ids = torch.zeros(len(seqs), width, dtype=torch.long)
            for b, s in enumerate(seqs):
                ids[b, : len(s)] = torch.tensor(s)
            text = embed(ids.to(self.device))  # (B, width, D); pads never reach a loss row
            x = torch.cat([image.to(text.dtype), text], dim=1)  # image first, then text
            hidden = self.lm.model(
                inputs_embeds=x, past_key_values=prefix.cache(len(seqs)), use_cache=True
            ).last_hidden_state
            n = image.shape[1]
            rows, labels = [], []
            for b, (s, t) in enumerate(zip(seqs, targets, strict=True)):
                first = n + len(s) - len(t) - 1  # the row that predicts the first target
                rows += [b * x.shape[1] + first + j for j in range(len(t))]
                labels += t
            h = hidden.reshape(-1, hidden.shape[-1])[torch.tensor(rows, device=self.device)]
            logits = self.lm.lm_head(h).float()
        return logits, torch.tensor(labels, device=self.device)

    def _sequences(self, idx: list[int], step: int) -> tuple[list[list[int]], list[list[int]]]:
        """Per example: the ids after the image (suffix + caption + end) and the targets."""
        seqs, targets = [], []
        for j, i in enumerate(idx):
            lay: Layout = self.layouts[(i + step + j) % len(self.layouts)]
            seqs.append(lay.suffix + self.targets[i])
            targets.append(self.targets[i])
        return seqs, targets

    def _lr_factor(self, step: int) -> float:
        warm = min(1.0, (step + 1) / max(1, self.cfg.warmup))
        return warm * 0.5 * (1 + math.cos(math.pi * min(1.0, step / self.cfg.steps)))

    def _fingerprint(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self.cfg).items() if k not in ("extra", "out", "work_dir")}

    def _resume(self, opt, sched) -> int:
        path = self.work / CHECKPOINT
        if not path.is_file():
            return 0
        state = torch.load(path, map_location=self.device, weights_only=False)
        if state["fingerprint"] != self._fingerprint():
            raise ValueError(
                f"{path} was written by a run with other settings; use another --out or delete it"
            )
        self.projector.load_state_dict(state["projector"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        return int(state["step"])

    def _checkpoint(self, opt, sched, step: int, loss: float) -> None:
        path = self.work / CHECKPOINT
        tmp = path.with_suffix(".tmp")
        torch.save(
            {
                "projector": self.projector.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "step": step,
                "loss": loss,
                "fingerprint": self._fingerprint(),
            },
            tmp,
        )
        os.replace(tmp, path)  # a kill mid-save leaves the last checkpoint whole

    def save(self, result: TrainResult) -> None:
        extra = {
            **self.connector.extra,
            "train": {
                **self._fingerprint(),
                "steps": result.steps,
                "final_loss": result.final_loss,
            },
        }
        cfg = ConnectorConfig(**{**asdict(self.connector), "extra": extra})
        save_connector(self.out, cfg, self.encoder, self.projector)
        (self.out / "train.json").write_text(json.dumps(asdict(result), indent=2) + "\n")


def end_of_turn_id(tokenizer: Any) -> int:
    """The id the chat template closes an assistant turn with (generation stops there)."""
    head = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], add_generation_prompt=True
    )
    full = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
        add_generation_prompt=False,
    )
    assert full.startswith(head), "the template's generation prompt starts the reply"
    return int(tokenizer.encode(full[len(head) + 1 :], add_special_tokens=False)[0])


def load_hf_lm(lm: str | None, device: torch.device) -> tuple[Any, Any, str]:
    """The LM as HF transformers' module (for autograd), mmserve's tokenizer (the one the
    server uses) and the LM's served name. bf16 on GPU, fp32 on CPU."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise RuntimeError(
            "connector training needs transformers: pip install 'mmserve[test]'"
        ) from exc
    from mmserve.config import EngineConfig
    from mmserve.engine.factory import model_name
    from mmserve.models.hub import resolve_model
    from mmserve.models.tokenizer import Tokenizer

    path = resolve_model(lm)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model = model.to(device)
    return model, Tokenizer(path), model_name(EngineConfig(model=lm))
