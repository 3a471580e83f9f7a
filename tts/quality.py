"""How close a voice is to its teacher: mel-cepstral distortion, durations, spectrograms.

- Mel cepstra: 10 ms hop, 25 ms window, 40 mel bands of log amplitude (natural log) over
  0-8 kHz (power floored at 1e-6), DCT-II (orthonormal), coefficients 1..24 (energy c0
  left out): a spectral envelope, coarse enough that pitch harmonics barely show.
- MCD between two utterances: frames paired by dynamic time warping on the cepstral
  distance (steps (1,0), (0,1), (1,1)), then the mean over the path of
  ``10 / ln 10 * sqrt(2 * sum_d (c_d - c'_d)^2)`` dB. Leading and trailing silence (frames
  40 dB under the loudest) is trimmed from both first.
- Duration: the trimmed length (first to last non-silent frame).
- ``spectrogram_png``: log-mel images, one row per signal, darker is louder (Pillow).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from tts.features import log_mel

RATE = 24000
HOP, WIN = 240, 600
N_MELS, N_CEPS, FMAX, FLOOR = 40, 24, 8000.0, 1e-6


def mel_db(wav: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """(T, n_mels) log-mel power in dB (0-12 kHz; for pictures)."""
    x = torch.from_numpy(np.asarray(wav, np.float32))[None]
    lm = log_mel(x, RATE, WIN, HOP, n_mels, n_fft=1024)[0]  # natural log of power
    return (10.0 / math.log(10.0) * lm).numpy()


def _log_amp(wav: np.ndarray) -> np.ndarray:
    x = torch.from_numpy(np.asarray(wav, np.float32))[None]
    return 0.5 * log_mel(x, RATE, WIN, HOP, N_MELS, n_fft=1024, fmax=FMAX, floor=FLOOR)[0].numpy()


def cepstra(wav: np.ndarray) -> np.ndarray:
    """(T, 24) mel cepstra of log amplitude, frames trimmed of edge silence."""
    log_amp = _log_amp(wav)
    lo, hi = voiced_span(log_amp)
    n = np.arange(N_MELS)
    dct = np.cos(math.pi / N_MELS * (n[None, :] + 0.5) * np.arange(N_CEPS + 1)[:, None])
    dct *= math.sqrt(2.0 / N_MELS)
    dct[0] /= math.sqrt(2.0)
    return (log_amp[lo:hi] @ dct.T)[:, 1:]


def voiced_span(log_amp: np.ndarray, floor_db: float = 40.0) -> tuple[int, int]:
    """[first, last + 1) frame within ``floor_db`` of the loudest frame."""
    energy = 20.0 / math.log(10.0) * np.log(np.exp(log_amp).mean(1) + 1e-9)
    loud = np.nonzero(energy > energy.max() - floor_db)[0]
    return (int(loud[0]), int(loud[-1]) + 1) if len(loud) else (0, len(energy))


def speech_seconds(wav: np.ndarray) -> float:
    lo, hi = voiced_span(_log_amp(wav))
    return (hi - lo) * HOP / RATE


def dtw_path(cost: np.ndarray) -> list[tuple[int, int]]:
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, n + 1):
        row, prev = acc[i], acc[i - 1]
        c = cost[i - 1]
        diag_up = np.minimum(prev[1:], prev[:-1]) + c  # from (i-1, j) or (i-1, j-1)
        for j in range(1, m + 1):  # then left moves along the row
            row[j] = min(diag_up[j - 1], row[j - 1] + c[j - 1])
    path, i, j = [], n, m
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        steps = (
            (acc[i - 1, j - 1], i - 1, j - 1),
            (acc[i - 1, j], i - 1, j),
            (acc[i, j - 1], i, j - 1),
        )
        _, i, j = min(steps)
    return path[::-1]


def mcd(ref: np.ndarray, test: np.ndarray) -> float:
    """DTW-aligned mel-cepstral distortion (dB) of ``test`` against ``ref`` (24 kHz)."""
    a, b = cepstra(ref), cepstra(test)
    diff = a[:, None, :] - b[None, :, :]
    dist = np.sqrt(2.0 * (diff**2).sum(-1))  # (Ta, Tb)
    path = dtw_path(dist)
    k = 10.0 / math.log(10.0)
    return float(k * np.mean([dist[i, j] for i, j in path]))


def spectrogram_png(rows: list[tuple[str, np.ndarray]], path: Path, seconds: float = 0.0) -> Path:
    """One log-mel image per (label, wav) stacked top to bottom, same time scale."""
    from PIL import Image, ImageDraw

    mels = [mel_db(w) for _, w in rows]
    width = max(int(seconds * RATE / HOP), max(m.shape[0] for m in mels))
    top = max(m.max() for m in mels)
    band, label_h = 160, 14
    img = Image.new("L", (width, len(rows) * (band + label_h)), 255)
    draw = ImageDraw.Draw(img)
    for r, ((label, _), m) in enumerate(zip(rows, mels, strict=True)):
        v = np.clip((m - (top - 80.0)) / 80.0, 0.0, 1.0)  # 80 dB range
        pix = (255 * (1.0 - v.T[::-1])).astype(np.uint8).repeat(2, axis=0)
        y = r * (band + label_h)
        draw.text((2, y), label, fill=0)
        img.paste(Image.fromarray(pix), (0, y + label_h))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path
