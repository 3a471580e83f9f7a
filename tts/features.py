"""Spectral features shared by codec training and the quality metrics (torch only).

``mel_filters`` is the Slaney-style triangular filter bank (as librosa's default);
``log_mel`` frames a signal without centring (frame ``t`` covers samples
``[t * hop, t * hop + win)``), which is how the frame codec's encoder sees audio.
"""

from __future__ import annotations

import math

import torch


def hz_to_mel(f: torch.Tensor) -> torch.Tensor:
    lin = f / (200.0 / 3)
    log = 15.0 + torch.log(torch.clamp(f, min=1e-9) / 1000.0) / (math.log(6.4) / 27.0)
    return torch.where(f >= 1000.0, log, lin)


def mel_to_hz(m: torch.Tensor) -> torch.Tensor:
    lin = m * (200.0 / 3)
    log = 1000.0 * torch.exp((m - 15.0) * (math.log(6.4) / 27.0))
    return torch.where(m >= 15.0, log, lin)


def mel_filters(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> torch.Tensor:
    """(n_mels, n_fft // 2 + 1) Slaney-normalised triangular filters."""
    fmax = fmax or sample_rate / 2
    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = mel_to_hz(
        torch.linspace(
            hz_to_mel(torch.tensor(fmin, dtype=torch.float64)).item(),
            hz_to_mel(torch.tensor(fmax, dtype=torch.float64)).item(),
            n_mels + 2,
            dtype=torch.float64,
        )
    )
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    fb = torch.clamp(torch.minimum(lower, upper), min=0.0)
    fb *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return fb.float()


def frames(x: torch.Tensor, win: int, hop: int, n: int | None = None) -> torch.Tensor:
    """(B, S) -> (B, T, win) uncentred frames; ``n`` frames (zero-padding the end)."""
    n = n if n is not None else max(1, (x.shape[-1] - win) // hop + 1)
    need = (n - 1) * hop + win
    if x.shape[-1] < need:
        x = torch.nn.functional.pad(x, (0, need - x.shape[-1]))
    return x[..., :need].unfold(-1, win, hop)


def log_mel(
    x: torch.Tensor,
    sample_rate: int,
    win: int,
    hop: int,
    n_mels: int,
    n: int | None = None,
    n_fft: int | None = None,
    fmax: float | None = None,
    floor: float = 1e-5,
) -> torch.Tensor:
    """(B, S) -> (B, T, n_mels) natural-log mel power (floored at ``floor``)."""
    n_fft = n_fft or win
    fr = frames(x, win, hop, n) * torch.hann_window(win, periodic=True, device=x.device)
    mag = torch.fft.rfft(fr, n=n_fft).abs()
    fb = mel_filters(sample_rate, n_fft, n_mels, fmax=fmax).to(x.device)
    return torch.log(torch.clamp(mag.pow(2) @ fb.T, min=floor))
