"""SNAC (multi-scale neural audio codec) decoder, whole-utterance and streaming.

The network is the ``snac`` package's decoder (quantizer ``from_codes`` + ``Decoder``),
re-implemented here so nothing imports ``snac`` at run time; module names mirror the
package's, so its state dicts load as they are (weight norm folded at load, whichever of
torch's two weight-norm layouts the file uses). Only the configurations without local
attention are covered (``attn_window_size: null``), which is SNAC 24 kHz, the codec
Orpheus speaks through.

SNAC's convolutions are "same"-padded, so the decoder looks ahead: a sample is final
once ``delay_samples`` more samples' worth of codes have arrived (24 kHz: 4,479 samples,
so ``lookahead_frames`` = 3 frames of 2,048 samples). The streaming decoder
(``tts.streaming``) emits exactly those final samples and equals the whole decode.

Its ``NoiseBlock`` adds ``randn * linear(x)``; here the noise is a pure function of
(stream seed, block, sample time) so that streaming equals whole; the parity test feeds
the same values to the reference in place of ``torch.randn``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tts.codec import CodecState, PCMBlock, StreamingCodec
from tts.streaming import StreamCtx, conv_same, conv_transpose, delay, gaussian_noise, snake

_OPEN = 1 << 40  # a row's end frame while it is still open


@dataclass(frozen=True)
class SNACConfig:
    """``config.json`` of a SNAC checkpoint (the ``snac`` package's constructor args)."""

    sampling_rate: int = 24000
    encoder_dim: int = 48
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)
    latent_dim: int | None = None
    decoder_dim: int = 1024
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    attn_window_size: int | None = None
    codebook_size: int = 4096
    codebook_dim: int = 8
    vq_strides: tuple[int, ...] = (4, 2, 1)
    noise: bool = True
    depthwise: bool = True

    def __post_init__(self) -> None:
        if self.attn_window_size is not None:
            raise ValueError(
                "SNAC configurations with local attention (attn_window_size) are "
                "not supported; SNAC 24 kHz (attn_window_size null) is"
            )
        if any(s % 2 for s in self.decoder_rates):
            raise ValueError(f"decoder_rates must be even, got {self.decoder_rates}")

    @classmethod
    def from_dict(cls, d: dict) -> SNACConfig:
        known: dict[str, Any] = {
            k: (tuple(v) if isinstance(v, list) else v)
            for k, v in d.items()
            if k in cls.__dataclass_fields__
        }
        return cls(**known)

    @property
    def hop(self) -> int:
        return int(np.prod(self.encoder_rates))

    @property
    def latent(self) -> int:
        return self.latent_dim or self.encoder_dim * 2 ** len(self.encoder_rates)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class Conv(nn.Module):
    """A folded weight-normed Conv1d ("same" padding, stride 1)."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cout, cin // groups, kernel))
        self.bias = nn.Parameter(torch.empty(cout)) if bias else None
        self.dilation, self.groups = dilation, groups

    def forward(self, x: torch.Tensor, ctx: StreamCtx | None = None) -> torch.Tensor:
        return conv_same(x, self.weight, self.bias, self.dilation, self.groups, ctx)


class ConvT(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cin, cout, 2 * stride))
        self.bias = nn.Parameter(torch.empty(cout))
        self.stride = stride

    def forward(self, x: torch.Tensor, ctx: StreamCtx | None = None) -> torch.Tensor:
        return conv_transpose(x, self.weight, self.bias, self.stride, ctx)


class Snake(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, dim, 1))

    def forward(self, x: torch.Tensor, ctx: StreamCtx | None = None) -> torch.Tensor:
        return snake(x, self.alpha)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [Snake(dim), Conv(dim, dim, 7, dilation, groups), Snake(dim), Conv(dim, dim, 1)]
        )
        self.lag = 3 * dilation  # the kernel-7 conv's padding: how far the branch lags

    def forward(self, x: torch.Tensor, ctx: StreamCtx | None = None) -> torch.Tensor:
        y = x
        for layer in self.block:
            y = layer(y, ctx)
        skip = x if ctx is None else delay(x, self.lag, ctx)
        return skip + y


class NoiseBlock(nn.Module):
    def __init__(self, dim: int, index: int) -> None:
        super().__init__()
        self.linear = Conv(dim, dim, 1, bias=False)
        self.index = index  # which noise block: part of the noise's key

    def forward(self, x: torch.Tensor, ctx: StreamCtx | None, seeds: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        times = (
            torch.arange(n, device=x.device).expand(x.shape[0], n) if ctx is None else ctx.times(n)
        )
        return x + gaussian_noise(seeds, self.index, times, x.dtype) * self.linear(x)


class DecoderBlock(nn.Module):
    def __init__(
        self, cin: int, cout: int, stride: int, noise: bool, groups: int, index: int
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [Snake(cin), ConvT(cin, cout, stride)]
        if noise:
            layers.append(NoiseBlock(cout, index))
        layers += [ResidualUnit(cout, d, groups) for d in (1, 3, 9)]
        self.block = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, ctx: StreamCtx | None, seeds: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, ctx, seeds) if isinstance(layer, NoiseBlock) else layer(x, ctx)
        return x


class Decoder(nn.Module):
    def __init__(self, cfg: SNACConfig) -> None:
        super().__init__()
        cin, ch = cfg.latent, cfg.decoder_dim
        layers: list[nn.Module] = (
            [Conv(cin, cin, 7, groups=cin), Conv(cin, ch, 1)]
            if cfg.depthwise
            else [Conv(cin, ch, 7)]
        )
        out = ch
        for i, stride in enumerate(cfg.decoder_rates):
            out = ch // 2 ** (i + 1)
            layers.append(
                DecoderBlock(ch // 2**i, out, stride, cfg.noise, out if cfg.depthwise else 1, i)
            )
        layers += [Snake(out), Conv(out, 1, 7)]
        self.model = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, ctx: StreamCtx | None, seeds: torch.Tensor) -> torch.Tensor:
        for layer in self.model:
            x = layer(x, ctx, seeds) if isinstance(layer, DecoderBlock) else layer(x, ctx)
        return torch.tanh(x)


class VQ(nn.Module):
    """One quantizer level's decode side: codebook -> out_proj -> repeat by its stride."""

    def __init__(self, cfg: SNACConfig, stride: int) -> None:
        super().__init__()
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)
        self.out_proj = Conv(cfg.codebook_dim, cfg.latent, 1)
        self.stride = stride

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z = self.out_proj(self.codebook(codes).transpose(1, 2))  # (B, latent, L)
        return z.repeat_interleave(self.stride, dim=-1)


class Quantizer(nn.Module):
    def __init__(self, cfg: SNACConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(VQ(cfg, s) for s in cfg.vq_strides)


class SNAC(StreamingCodec):
    """SNAC's decoder as a :class:`StreamingCodec`. A frame holds, level by level, the
    codes of one coarsest-level step: 1 + 2 + 4 = 7 codes for strides (4, 2, 1), in
    the order [l0, l1a, l1b, l2a, l2b, l2c, l2d]."""

    tolerance = 1e-4

    def __init__(self, cfg: SNACConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or SNACConfig()
        top = max(cfg.vq_strides)
        self.per_level = [top // s for s in cfg.vq_strides]  # codes a frame, each level
        self.sample_rate = cfg.sampling_rate
        self.frame_samples = cfg.hop * top
        self.codes_per_frame = sum(self.per_level)
        self.codebook_size = cfg.codebook_size
        self.steps_per_frame = top  # latent steps a frame
        self.quantizer = Quantizer(cfg)
        self.decoder = Decoder(cfg)
        self._shapes: list[tuple[int, int]] | None = None
        self._delay = 0

    # -- loading -------------------------------------------------------------------
    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor], cfg: SNACConfig | None = None) -> SNAC:
        model = cls(cfg)
        folded = fold_weight_norm(sd)  # the encoder's and in_proj's tensors go unused
        missing = [k for k, _ in model.named_parameters() if k not in folded]
        if missing:
            raise ValueError(f"SNAC state dict lacks {missing[:5]}")
        model.load_state_dict({k: v for k, v in folded.items() if k in model.state_dict()})
        return model.eval()

    @classmethod
    def from_dir(cls, path: str | Path) -> SNAC:
        """A SNAC checkpoint directory: ``config.json`` + ``pytorch_model.bin`` or
        ``model.safetensors``."""
        path = Path(path)
        cfg = SNACConfig.from_dict(json.loads((path / "config.json").read_text()))
        if (path / "model.safetensors").is_file():
            from safetensors.torch import load_file

            sd = load_file(str(path / "model.safetensors"))
        else:
            sd = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return cls.from_state_dict(sd, cfg)

    # -- whole ---------------------------------------------------------------------
    def levels(self, codes: torch.Tensor) -> list[torch.Tensor]:
        """(B, n, 7) frames -> the per-level code rows [(B, n), (B, 2n), (B, 4n)]."""
        self.check_codes(codes)
        out, at = [], 0
        for k in self.per_level:
            out.append(codes[:, :, at : at + k].reshape(codes.shape[0], -1))
            at += k
        return out

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        z = 0
        for vq, level in zip(self.quantizer.quantizers, self.levels(codes), strict=True):
            z = z + vq(level)
        return z  # type: ignore[return-value]

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, seeds: list[int] | None = None) -> torch.Tensor:
        seed = _seeds(seeds, codes.shape[0], codes.device)
        return self.decoder(self.latent(codes.to(self.device)), None, seed)[:, 0]

    # -- streaming -----------------------------------------------------------------
    @property
    def delay_samples(self) -> int:
        self._ensure_shapes()
        return self._delay

    def _ensure_shapes(self) -> None:
        """One recording pass (1 frame, 1 row) finds every op's state shape and the lag."""
        if self._shapes is not None:
            return
        shapes: list[tuple[int, int]] = []
        state = CodecState([], np.zeros(1, np.int64), np.full(1, -1), np.zeros(1, np.int64))
        dev = self.device
        ctx = StreamCtx(
            state,
            torch.zeros(1, dtype=torch.long, device=dev),
            torch.full((1,), _OPEN, device=dev),
            self.steps_per_frame,
            shapes,
        )
        with torch.inference_mode():
            codes = torch.zeros(1, 1, self.codes_per_frame, dtype=torch.long, device=dev)
            self.decoder(self.latent(codes), ctx, torch.zeros(1, dtype=torch.long, device=dev))
        self._shapes, self._delay = shapes, int(-ctx.t0[0])

    def init_state(self, batch: int, seeds: list[int] | None = None) -> CodecState:
        self._ensure_shapes()
        assert self._shapes is not None
        p = next(self.parameters())
        bufs = [torch.zeros(batch, c, n, dtype=p.dtype, device=p.device) for c, n in self._shapes]
        return CodecState(
            bufs,
            np.zeros(batch, np.int64),
            np.full(batch, -1, np.int64),
            np.array(seeds if seeds is not None else [0] * batch, np.int64),
        )

    @torch.inference_mode()
    def step(self, codes: torch.Tensor, state: CodecState) -> PCMBlock:
        self.check_codes(codes)
        return self._run(codes.to(self.device), state)

    @torch.inference_mode()
    def flush(self, state: CodecState) -> PCMBlock:
        state.end = state.frames.copy()
        n = max(1, self.lookahead_frames)
        dummy = torch.zeros(
            state.batch, n, self.codes_per_frame, dtype=torch.long, device=self.device
        )
        return self._run(dummy, state)

    def _run(self, codes: torch.Tensor, state: CodecState) -> PCMBlock:
        dev = self.device
        before = state.frames.copy()
        end = np.where(state.end < 0, _OPEN, state.end)
        ctx = StreamCtx(
            state,
            torch.from_numpy(before).to(dev),
            torch.from_numpy(end).to(dev),
            self.steps_per_frame,
        )
        seeds = torch.from_numpy(state.seeds).to(dev)
        pcm = self.decoder(self.latent(codes), ctx, seeds)[:, 0]
        assert ctx.i == len(state.buffers)
        return PCMBlock(pcm, *state.advance(codes.shape[1], self.frame_samples, self._delay))


def _seeds(seeds: list[int] | None, batch: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(
        seeds if seeds is not None else [0] * batch, dtype=torch.long, device=device
    )


def fold_weight_norm(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """State dict with weight norm folded: ``X.parametrizations.weight.original0/1`` (torch's
    parametrization) or ``X.weight_g/X.weight_v`` (the old hook) -> ``X.weight``
    (``g * v / |v|``, the norm over every dim but the first)."""
    out: dict[str, torch.Tensor] = {}
    for key, t in sd.items():
        for g_suffix, v_suffix in (
            (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
            (".weight_g", ".weight_v"),
        ):
            if key.endswith(g_suffix):
                base = key[: -len(g_suffix)]
                v = sd[base + v_suffix].float()
                norm = v.norm(dim=tuple(range(1, v.dim())), keepdim=True)
                out[base + ".weight"] = v * (t.float() / norm)
                break
            if key.endswith(v_suffix):
                break
        else:
            out[key] = t
    return out
