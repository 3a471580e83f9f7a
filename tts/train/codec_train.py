"""Stage 2 of ``mmserve voice train``: the frame codec on the teacher's audio.

Random 1.2 s crops (a batch is a pure function of the step, so a resumed run sees the
same batches), reconstructed through encoder -> FSQ -> causal decoder, scored by
multi-resolution STFT and log-mel L1. Then every teacher sentence is encoded once into
``codes.npz`` for the backbone (stage 3).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from tts.framecodec import FrameCodec, FrameCodecConfig
from tts.train.loop import train
from tts.train.losses import mel_l1, multi_resolution_stft
from tts.train.teacher import Teacher


def crops(
    teacher: Teacher, rng: np.random.Generator, batch: int, frames: int, hop: int, items: list[int]
) -> torch.Tensor:
    """(batch, frames * hop) random crops, frame-aligned, zero-padded past an end."""
    n = frames * hop
    out = np.zeros((batch, n), np.float32)
    for b in range(batch):
        wav = teacher.wav(int(rng.choice(items)))
        start = hop * int(rng.integers(0, max(1, (len(wav) - n) // hop + 1)))
        piece = wav[start : start + n]
        out[b, : len(piece)] = piece
    return torch.from_numpy(out)


def train_codec(
    teacher: Teacher,
    work: Path,
    train_items: list[int],
    steps: int,
    batch: int = 16,
    crop_frames: int = 60,
    lr: float = 1e-3,
    device: str = "cpu",
    deadline: float | None = None,
    cfg: FrameCodecConfig | None = None,
) -> FrameCodec | None:
    """The trained codec, or None if ``deadline`` came first (a checkpoint is kept)."""
    torch.manual_seed(0)
    codec = FrameCodec(cfg).to(device)
    hop = codec.cfg.hop

    def step_fn(step: int) -> torch.Tensor:
        rng = np.random.default_rng([7, step])
        x = crops(teacher, rng, batch, crop_frames, hop, train_items).to(device)
        y = codec.synthesize(codec.encode(x).values)
        return multi_resolution_stft(y, x) + mel_l1(y, x, codec.sample_rate)

    if not train("codec", work, codec, step_fn, steps, lr, warmup=200, deadline=deadline):
        return None
    return codec.eval()


@torch.inference_mode()
def encode_all(
    codec: FrameCodec, teacher: Teacher, out: Path, device: str = "cpu", batch: int = 0
) -> None:
    """Every sentence's codes (one row per frame) into ``out`` (codes.npz): sentences of
    about the same length encoded ``batch`` at a time (0: 64 on a GPU, where one call
    costs its launches, 1 on the CPU, where padding costs compute), each the codes it
    has encoded alone (``FrameCodec.encode``'s ``lengths``)."""
    batch = batch or (1 if device == "cpu" else 64)
    t0 = time.perf_counter()
    order = sorted(range(len(teacher)), key=lambda i: teacher.items[i].length)
    codes: list[np.ndarray] = [np.zeros((0, 1), np.int16)] * len(teacher)
    for a in range(0, len(order), batch):
        pick = order[a : a + batch]
        wavs = [teacher.wav(i) for i in pick]
        lengths = [len(w) for w in wavs]
        x = np.zeros((len(pick), max(lengths)), np.float32)
        for b, w in enumerate(wavs):
            x[b, : len(w)] = w
        got = codec.encode(torch.from_numpy(x).to(device), lengths).codes.cpu().numpy()
        for b, i in enumerate(pick):
            codes[i] = got[b, : -(-lengths[b] // codec.cfg.hop)].astype(np.int16)
    offsets = np.cumsum([0] + [len(c) for c in codes]).astype(np.int64)
    tmp = out.with_suffix(".tmp.npz")
    np.savez(tmp, codes=np.concatenate(codes), offsets=offsets)
    tmp.replace(out)
    print(f"codec: encoded {len(codes)} sentences in {time.perf_counter() - t0:.0f} s", flush=True)
