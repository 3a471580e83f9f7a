"""Convolution layers that run whole or streaming with the same weights.

Each op takes ``ctx=None`` (whole utterance: the reference's padded convolutions) or a
:class:`StreamCtx` (one chunk of a stream). In streaming, a "same"-padded convolution of
kernel span ``2p`` becomes a causal one whose output lags by ``p``: its state is the last
``2p`` inputs, and the first state is zeros, which is exactly the whole decode's left
padding. A transposed convolution keeps its overlap-add tail. Because the padded reference
zero-pads *each layer's own input* at both ends, every op that mixes time zeroes the
columns of its input that lie before a row's start or after its end (``StreamCtx.mask``):
then a stream fed in any chunking, then flushed, yields the whole decode's samples, only
later (``StreamCtx`` tracks each row's time so the codec can say which columns are real).

Every op emits exactly ``n * rate`` columns for ``n`` input frames, for every row, so rows
of different ages batch together without ragged tensors.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tts.codec import CodecState


class StreamCtx:
    """One streaming pass over a state: buffers are read and replaced in op order.

    ``t0`` is, per row, the time (in samples at the current rate) of the signal's first
    column; ``rate`` is samples per code frame at the current point of the network;
    ``end`` is each row's frame count once flushed (a huge number while open)."""

    def __init__(
        self,
        state: CodecState,
        t0_frames: torch.Tensor,
        end_frames: torch.Tensor,
        rate: int,
        record: list[tuple[int, int]] | None = None,
        keep: torch.Tensor | None = None,
    ) -> None:
        self.state, self.rate = state, rate
        self.t0 = t0_frames * rate  # (B,) int64 on the device
        self.end_frames = end_frames
        self.i = 0
        self.record = record  # shape-recording pass: (channels, length) per buffer
        # (B,) bool: store writes the state's own tensors in place, and only these rows
        # (``CodecSlots``' recorded steps: fixed addresses, the other slots untouched)
        self.keep = keep

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        """Zero the columns of ``x`` (B, C, n) outside each row's [0, end)."""
        t = self.t0[:, None] + torch.arange(x.shape[-1], device=x.device)  # (B, n)
        keep = (t >= 0) & (t < self.end_frames[:, None] * self.rate)
        return x * keep[:, None, :].to(x.dtype)

    def buffer(self, x: torch.Tensor, length: int) -> torch.Tensor:
        """This op's stored history (B, C, length), zeros on a fresh state."""
        if self.record is not None:
            self.record.append((x.shape[1], length))
            return x.new_zeros(x.shape[0], x.shape[1], length)
        buf = self.state.buffers[self.i]
        assert buf.shape[1:] == (x.shape[1], length), "state does not match this codec"
        return buf

    def store(self, new: torch.Tensor) -> None:
        if self.keep is not None:
            keep_rows(self.state.buffers[self.i], new, self.keep)
        elif self.record is None:
            self.state.buffers[self.i] = new.contiguous()
        self.i += 1

    def times(self, n: int) -> torch.Tensor:
        """(B, n) times of the current signal's columns."""
        return self.t0[:, None] + torch.arange(n, device=self.t0.device)


def keep_rows(buf: torch.Tensor, new: torch.Tensor, keep: torch.Tensor) -> None:
    """``buf[r] = new[r]`` in place for the rows ``r`` where ``keep`` (B,) is set, with no
    host sync (a CUDA graph records it)."""
    buf.copy_(torch.where(keep.view(-1, *([1] * (buf.dim() - 1))), new, buf))


def conv_same(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int = 1,
    groups: int = 1,
    ctx: StreamCtx | None = None,
) -> torch.Tensor:
    """A stride-1 convolution padded by half its span on each side ("same" length)."""
    span = (weight.shape[-1] - 1) * dilation
    assert span % 2 == 0, "an odd span has no symmetric padding"
    p = span // 2
    if ctx is None:
        return F.conv1d(x, weight, bias, padding=p, dilation=dilation, groups=groups)
    if p == 0:
        return F.conv1d(x, weight, bias, groups=groups)
    full = torch.cat([ctx.buffer(x, span), ctx.mask(x)], dim=-1)  # (B, C, span + n)
    ctx.store(full[..., -span:])
    ctx.t0 = ctx.t0 - p
    return F.conv1d(full, weight, bias, dilation=dilation, groups=groups)


def conv_transpose(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int,
    ctx: StreamCtx | None = None,
) -> torch.Tensor:
    """SNAC's upsampler: kernel ``2 * stride``, padding ``ceil(stride / 2)``, output
    padding ``stride % 2``, so T inputs give exactly ``T * stride`` outputs."""
    pad = math.ceil(stride / 2)
    if ctx is None:
        return F.conv_transpose1d(
            x, weight, bias, stride=stride, padding=pad, output_padding=stride % 2
        )
    n, k = x.shape[-1], weight.shape[-1]
    z = F.conv_transpose1d(ctx.mask(x), weight, None, stride=stride)  # (B, C, n*s + k - s)
    tail = ctx.buffer(z, k - stride)
    z = torch.cat([z[..., : k - stride] + tail, z[..., k - stride :]], dim=-1)
    ctx.store(z[..., n * stride :])
    ctx.t0 = ctx.t0 * stride - pad
    ctx.rate *= stride
    y = z[..., : n * stride]
    return y if bias is None else y + bias[:, None]


def delay(x: torch.Tensor, n: int, ctx: StreamCtx) -> torch.Tensor:
    """``x`` delayed by ``n`` columns (a residual branch's skip path); ``ctx.t0`` is the
    caller's to keep."""
    if n == 0:
        return x
    full = torch.cat([ctx.buffer(x, n), x], dim=-1)
    ctx.store(full[..., -n:])
    return full[..., : x.shape[-1]]


_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer avalanche (lowbias32) on int64 tensors holding 32-bit values."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def gaussian_noise(
    seeds: torch.Tensor, block: int, times: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Standard normal noise that is a pure function of (row seed, block, time): the same
    sample whatever the chunking. ``seeds`` (B,), ``times`` (B, n) -> (B, 1, n)."""
    base = _mix32(seeds[:, None] * 0x9E3779B1 + block * 0x85EBCA77 + 0x27D4EB2F)
    key = _mix32(base ^ _mix32(times & _M32)) * 2  # two words a sample
    u1 = (_mix32(key).double() + 0.5) / 2**32  # in (0, 1)
    u2 = (_mix32(key + 1).double() + 0.5) / 2**32
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return z.to(dtype)[:, None, :]


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """DAC/SNAC's periodic activation, in the reference's operation order."""
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)
