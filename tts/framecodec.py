"""The default voice's codec: one code a 20 ms frame, decoded causally (no lookahead).

- Encoder (training and resynthesis only): log-mel frames -> convolutions -> a few
  bounded dims -> finite scalar quantization (FSQ, Mentzer et al. 2023): each dim rounds
  to one of ``levels[i]`` values and the code is their mixed-radix index
  (7*5*5*5*5 = 4,375 codes).
- Decoder: the code's FSQ values -> causal dilated convolutions (each output frame sees
  only its own and earlier frames) -> per frame a log-magnitude and a phase for each of
  ``hop + 1`` bins -> inverse FFT of ``2 * hop`` samples -> Hann window -> overlap-add.
  Frame ``t``'s window starts at sample ``t * hop``, so samples ``[t*hop, (t+1)*hop)`` are
  final once frame ``t`` is in: the codec is causal, and its stream state is each
  convolution's last ``(k - 1) * d`` inputs plus the previous frame's second half.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tts.codec import CodecState, PCMBlock, StreamingCodec
from tts.features import log_mel
from tts.streaming import StreamCtx, keep_rows


@dataclass(frozen=True)
class FrameCodecConfig:
    sample_rate: int = 24000
    hop: int = 480
    levels: tuple[int, ...] = (7, 5, 5, 5, 5)
    n_mels: int = 80
    enc_dim: int = 256
    enc_layers: int = 4
    dec_dim: int = 256
    dilations: tuple[int, ...] = (1, 2, 4, 1, 2, 4)
    kernel: int = 3

    def __post_init__(self) -> None:
        if any(n % 2 == 0 or n < 3 for n in self.levels):
            raise ValueError(f"FSQ levels must be odd and >= 3, got {self.levels}")

    @classmethod
    def from_dict(cls, d: dict) -> FrameCodecConfig:
        known: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in d.items()
            if k in cls.__dataclass_fields__
        }
        return cls(**known)


@dataclass
class Encoded:
    """An encoder pass: codes (B, T) and the quantized values fed to the decoder."""

    codes: torch.Tensor
    values: torch.Tensor  # (B, T, D) in [-1, 1], straight-through gradients
    extra: dict = field(default_factory=dict)


class FSQ(nn.Module):
    mid: torch.Tensor  # (D,) (levels - 1) / 2
    basis: torch.Tensor  # (D,) mixed-radix place values

    def __init__(self, levels: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("mid", torch.tensor([(n - 1) / 2 for n in levels]), persistent=False)
        basis = np.cumprod([1, *levels[:-1]])
        self.register_buffer("basis", torch.tensor(basis, dtype=torch.long), persistent=False)
        self.size = int(np.prod(levels))

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(…, D) unbounded -> (codes (…), values in [-1, 1] with straight-through)."""
        bounded = torch.tanh(z) * self.mid
        rounded = bounded + (torch.round(bounded) - bounded).detach()
        codes = ((torch.round(bounded) + self.mid).long() * self.basis).sum(-1)
        return codes, rounded / self.mid

    def values(self, codes: torch.Tensor) -> torch.Tensor:
        """(…) codes -> (…, D) values in [-1, 1]."""
        digits = (codes[..., None] // self.basis) % (2 * self.mid.long() + 1)
        return (digits.to(self.mid.dtype) - self.mid) / self.mid


class CausalBlock(nn.Module):
    """x + W2 gelu(causal dilated conv(norm x))."""

    def __init__(self, dim: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.conv = nn.Conv1d(dim, dim, kernel, dilation=dilation)
        self.out = nn.Conv1d(dim, dim, 1)
        self.span = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor, ctx: StreamCtx | None = None) -> torch.Tensor:
        h = self.norm(x.transpose(1, 2)).transpose(1, 2)  # (B, C, T)
        if ctx is None:
            h = F.pad(h, (self.span, 0))
        else:
            h = torch.cat([ctx.buffer(h, self.span), h], dim=-1)
            ctx.store(h[..., -self.span :])
        return x + self.out(F.gelu(self.conv(h)))


class FrameCodec(StreamingCodec):
    tolerance = 1e-5
    window: torch.Tensor

    def __init__(self, cfg: FrameCodecConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or FrameCodecConfig()
        self.sample_rate, self.frame_samples = cfg.sample_rate, cfg.hop
        self.codes_per_frame = 1
        self.fsq = FSQ(cfg.levels)
        self.codebook_size = self.fsq.size
        d = len(cfg.levels)
        enc: list[nn.Module] = [nn.Conv1d(cfg.n_mels, cfg.enc_dim, 3, padding=1)]
        for _ in range(cfg.enc_layers):
            enc += [nn.GELU(), nn.Conv1d(cfg.enc_dim, cfg.enc_dim, 3, padding=1)]
        enc += [nn.GELU(), nn.Conv1d(cfg.enc_dim, d, 1)]
        self.encoder = nn.Sequential(*enc)
        self.dec_in = nn.Conv1d(d, cfg.dec_dim, 1)
        self.blocks = nn.ModuleList(
            CausalBlock(cfg.dec_dim, cfg.kernel, dl) for dl in cfg.dilations
        )
        self.dec_norm = nn.LayerNorm(cfg.dec_dim)
        self.head = nn.Linear(cfg.dec_dim, 2 * (cfg.hop + 1))
        self.register_buffer(
            "window", torch.hann_window(2 * cfg.hop, periodic=True), persistent=False
        )

    # -- encoder -------------------------------------------------------------------
    def encode(self, audio: torch.Tensor, lengths: list[int] | None = None) -> Encoded:
        """(B, S) audio -> codes for ceil(S / hop) frames. ``lengths``: each row's own
        length in samples, the rest zero padding; row b's first ceil(lengths[b] / hop)
        frames are then computed as when it is encoded alone (the mel frames are
        uncentred, so padding past a row's end is what its own encode pads with, and the
        encoder's convolutions see zeros past a row's last frame, as its own zero
        padding). On the CPU the codes are bit-identical to encoding each row alone
        (``tests/tts/test_voice_train_data.py``)."""
        hop = self.cfg.hop
        n = -(-audio.shape[-1] // hop)
        mel = log_mel(audio, self.sample_rate, 2 * hop, hop, self.cfg.n_mels, n=n)  # (B, T, M)
        x = mel.transpose(1, 2)
        if lengths is None:
            z = self.encoder(x)
        else:
            frames = torch.tensor([-(-s // hop) for s in lengths], device=x.device)
            keep = (torch.arange(n, device=x.device)[None] < frames[:, None])[:, None]
            for layer in self.encoder:
                x = layer(x * keep if isinstance(layer, nn.Conv1d) else x)
            z = x
        codes, values = self.fsq.quantize(z.transpose(1, 2))  # (B, T, D)
        return Encoded(codes, values)

    # -- decoder -------------------------------------------------------------------
    def frames_out(self, values: torch.Tensor, ctx: StreamCtx | None = None) -> torch.Tensor:
        """(B, T, D) FSQ values -> (B, T, 2*hop) windowed frames."""
        x = self.dec_in(values.transpose(1, 2))
        for block in self.blocks:
            x = block(x, ctx)
        x = self.head(self.dec_norm(x.transpose(1, 2)))  # (B, T, 2*(hop+1))
        logmag, phase = x.float().chunk(2, dim=-1)
        spec = torch.polar(torch.exp(torch.clamp(logmag, max=6.0)), phase)
        return torch.fft.irfft(spec, n=2 * self.cfg.hop) * self.window

    def synthesize(self, values: torch.Tensor) -> torch.Tensor:
        """(B, T, D) values -> (B, T * hop) audio (training and whole decode)."""
        fr = self.frames_out(values)
        h = self.cfg.hop
        tails = F.pad(fr[:, :-1, h:], (0, 0, 1, 0))  # frame t-1's second half under t
        return (fr[:, :, :h] + tails).reshape(fr.shape[0], -1)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, seeds: list[int] | None = None) -> torch.Tensor:
        self.check_codes(codes)
        return self.synthesize(self.fsq.values(codes[..., 0].to(self.device)))

    # -- streaming -----------------------------------------------------------------
    def init_state(self, batch: int, seeds: list[int] | None = None) -> CodecState:
        p = self.head.weight
        spans = [(self.cfg.kernel - 1) * d for d in self.cfg.dilations]
        bufs = [
            torch.zeros(batch, self.cfg.dec_dim, s, dtype=p.dtype, device=p.device) for s in spans
        ]
        bufs.append(torch.zeros(batch, self.cfg.hop, dtype=torch.float32, device=p.device))
        return CodecState(
            bufs, np.zeros(batch, np.int64), np.full(batch, -1, np.int64), np.zeros(batch, np.int64)
        )

    @torch.inference_mode()
    def step(self, codes: torch.Tensor, state: CodecState) -> PCMBlock:
        self.check_codes(codes)
        pcm = self._advance(codes, state)
        return PCMBlock(pcm, *state.advance(codes.shape[1], self.cfg.hop))

    @torch.inference_mode()
    def step_rows(self, codes: torch.Tensor, keep: torch.Tensor, state: CodecState) -> torch.Tensor:
        """``step``'s device half for the rows where ``keep`` (B,) is set: their state is
        written in place and every other row's is left as it was (their PCM is not
        meaningful). No host sync and no host bookkeeping (``state.frames`` is the
        caller's), so a CUDA graph can record it (``CodecSlots``). -> (B, n * hop) PCM."""
        self.check_codes(codes)
        return self._advance(codes, state, keep)

    def _advance(
        self, codes: torch.Tensor, state: CodecState, keep: torch.Tensor | None = None
    ) -> torch.Tensor:
        ctx = StreamCtx(state, torch.zeros(1), torch.zeros(1), 1, keep=keep)
        fr = self.frames_out(self.fsq.values(codes[..., 0].to(self.device)), ctx)
        h = self.cfg.hop
        tails = torch.cat([state.buffers[-1][:, None], fr[:, :-1, h:]], dim=1)
        if keep is None:
            state.buffers[-1] = fr[:, -1, h:].contiguous()
        else:
            keep_rows(state.buffers[-1], fr[:, -1, h:], keep)
        return (fr[:, :, :h] + tails).reshape(fr.shape[0], -1)

    def flush(self, state: CodecState) -> PCMBlock:
        """Causal: every sample was final when its frame arrived; nothing is left."""
        state.end = state.frames.copy()
        empty = torch.zeros(state.batch, 0, device=self.device)
        return PCMBlock(empty, [0] * state.batch, [0] * state.batch)

    # -- files ---------------------------------------------------------------------
    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        (path / "codec.json").write_text(json.dumps({"type": "frame", **asdict(self.cfg)}))
        dec = {
            k: v.detach().to(torch.float16).contiguous()
            for k, v in self.state_dict().items()
            if not k.startswith("encoder.")
        }
        save_file(dec, str(path / "codec.safetensors"))

    @classmethod
    def load(cls, path: Path) -> FrameCodec:
        """A saved decoder (the encoder is not shipped: its weights stay random)."""
        from safetensors.torch import load_file

        cfg = json.loads((path / "codec.json").read_text())
        cfg.pop("type", None)
        model = cls(FrameCodecConfig.from_dict(cfg))
        sd = {k: v.float() for k, v in load_file(str(path / "codec.safetensors")).items()}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and all(k.startswith("encoder.") for k in missing), missing
        return model.eval()
