"""Reconstruction losses for the frame codec: multi-resolution STFT and log-mel L1."""

from __future__ import annotations

import torch

from tts.features import mel_filters

RESOLUTIONS = ((512, 128), (1024, 256), (2048, 512))


def _mag(x: torch.Tensor, n_fft: int, hop: int) -> torch.Tensor:
    win = torch.hann_window(n_fft, device=x.device)
    spec = torch.stft(x, n_fft, hop, window=win, return_complex=True)
    return spec.abs().clamp(min=1e-7)


def multi_resolution_stft(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Spectral convergence + log-magnitude L1, averaged over three resolutions."""
    total = y.new_zeros(())
    for n_fft, hop in RESOLUTIONS:
        my, mx = _mag(y, n_fft, hop), _mag(x, n_fft, hop)
        sc = torch.linalg.norm(mx - my) / torch.linalg.norm(mx).clamp(min=1e-7)
        total = total + sc + (my.log() - mx.log()).abs().mean()
    return total / len(RESOLUTIONS)


def mel_l1(
    y: torch.Tensor,
    x: torch.Tensor,
    sample_rate: int,
    n_fft: int = 1024,
    hop: int = 256,
    n_mels: int = 80,
) -> torch.Tensor:
    fb = mel_filters(sample_rate, n_fft, n_mels).to(y.device)

    def lm(a: torch.Tensor) -> torch.Tensor:
        return torch.log((_mag(a, n_fft, hop).pow(2).transpose(1, 2) @ fb.T).clamp(min=1e-5))

    return (lm(y) - lm(x)).abs().mean()
