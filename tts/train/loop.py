"""A resumable training loop: checkpoints every few minutes, resumes where it stopped.

``train(name, work, model, step_fn, steps, ...)`` runs ``step_fn(step) -> loss`` under
AdamW with linear warm-up and cosine decay. Model, optimizer, step and RNG states are
saved to ``work/ckpt.pt`` every ``save_every_s`` seconds, at the end and when the time
budget runs out, so a killed or time-boxed run continues from its last checkpoint with the
same schedule (the schedule depends on the step only).

With ``evaluate`` (a validation loss), the weights are scored before the first step, every
``eval_every`` steps and at the end; the best scoring ones are kept in ``work/best.pt`` and
are the model ``train`` leaves behind (early stopping without stopping: a small corpus is
memorised long before a fixed schedule ends; a run from trained weights never leaves
worse ones).
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def _set_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def train(
    name: str,
    work: Path,
    model: nn.Module,
    step_fn: Callable[[int], torch.Tensor],
    steps: int,
    lr: float,
    warmup: int = 200,
    deadline: float | None = None,
    save_every_s: float = 300.0,
    log_every: int = 50,
    weight_decay: float = 0.01,
    on_log: Callable[[int, float], None] | None = None,
    evaluate: Callable[[], float] | None = None,
    eval_every: int = 250,
) -> bool:
    """Train until ``steps`` (True) or until ``deadline`` (time.time(); False)."""
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "ckpt.pt"
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=lr,
        betas=(0.9, 0.98),
        weight_decay=weight_decay,
    )
    step = 0
    if ckpt.is_file():
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        step = saved["step"]
        _set_rng(saved["rng"])
        print(f"{name}: resumed at step {step}/{steps}", flush=True)
    best_path = work / "best.pt"
    # a best.pt left by a run that validated means nothing to one that does not
    best = (
        torch.load(best_path, map_location="cpu", weights_only=False)
        if evaluate is not None and best_path.is_file()
        else None
    )

    def score() -> None:
        nonlocal best
        value = evaluate()  # type: ignore[misc]
        better = best is None or value < best["loss"]
        print(
            f"{name}: step {step} validation loss {value:.4f}{' (best)' if better else ''}",
            flush=True,
        )
        if better:
            # a copy: state_dict() holds the live tensors, which training goes on changing
            weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            best = {"model": weights, "step": step, "loss": value}
            tmp = best_path.with_suffix(f".tmp{os.getpid()}")
            torch.save(best, tmp)
            os.replace(tmp, best_path)

    last_save, t0, avg = time.time(), time.time(), None
    if evaluate is not None and step == 0 and best is None:
        score()  # the starting weights are a candidate too (a run from a voice's weights)
    model.train()
    while step < steps:
        if deadline is not None and time.time() > deadline:
            _save(ckpt, model, opt, step)
            print(f"{name}: time is up at step {step}/{steps}; checkpoint saved", flush=True)
            return False
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        loss = step_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        value = float(loss.detach())
        avg = value if avg is None else 0.98 * avg + 0.02 * value
        if step % log_every == 0 or step == steps:
            print(
                f"{name}: step {step}/{steps} loss {avg:.4f} ({(time.time() - t0) / 60:.1f} min)",
                flush=True,
            )
            if on_log is not None:
                on_log(step, avg)
        if evaluate is not None and (step % eval_every == 0 or step == steps):
            score()
        if time.time() - last_save > save_every_s:
            _save(ckpt, model, opt, step)
            last_save = time.time()
    _save(ckpt, model, opt, step)
    if evaluate is not None and best is None:
        score()
    if best is not None:
        model.load_state_dict(best["model"])
        print(
            f"{name}: kept the weights of step {best['step']} (validation loss {best['loss']:.4f})",
            flush=True,
        )
    model.eval()
    return True


def _save(path: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(
        {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "rng": _rng_state()},
        tmp,
    )
    os.replace(tmp, path)
