"""Small steps (up to 16 tokens) of a whole Llama stack in one persistent launch, where
it applies.

:mod:`mmserve.kernels.triton_decode_stack` holds the kernel; this decides when it runs
and keeps the layer weights stacked (one (L, ...) tensor per kind, the layers' own
parameters rebound as views into it, so no weight is held twice).

It runs for a step of at most ``MAX_ROWS`` (16) tokens on CUDA — decodes of up to 16
sequences, a verify block, a short prompt chunk — when the layered path would take the
fused Triton kernels (bf16, batch-invariant mode, hidden <= ``FUSE_MAX_HIDDEN``, a bf16
cache), the model has no QKV bias, q/k norm or sliding window, and each phase's tiles
fit one program per SM (``fits_one_wave``). Its output has the
bits of the layered path (GPU tests), so which one ran never shows in a token.
``KernelConfig.decode_stack`` off (``MMSERVE_DECODE_STACK=0``) keeps the layered path,
for comparisons.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from mmserve.kernels import fused
from mmserve.kernels.settings import current, override
from mmserve.kernels.triton_decode_stack import MAX_ROWS
from mmserve.kernels.triton_dispatch import use_triton

# On by default: faster than the layered path at batch 1 (docs/performance.md).
_counts = {"runs": 0}

# (stacked name, attribute path under a layer)
STACKED = (
    ("qkv", "attn.qkv_weight"),
    ("o", "attn.o_weight"),
    ("gate_up", "mlp.gate_up_weight"),
    ("down", "mlp.down_weight"),
    ("input_norm", "input_norm"),
    ("post_norm", "post_attn_norm"),
)


def decode_stack_enabled() -> bool:
    """Whether small steps may run as one launch (``KernelConfig.decode_stack``)."""
    return current().decode_stack


def runs() -> int:
    """Launches of the stack so far (a forward the caller watches ran it if this moved)."""
    return _counts["runs"]


@contextlib.contextmanager
def serial_splits() -> Iterator[None]:
    """Within it, launches keep every tile's key splits in one program: the stack's
    variant without the spread path (fewer registers) and the layered attention kernel
    (``triton_attention.SPREAD``). CUDA graphs captured inside replay that variant; the
    bits are the same either way (GPU tests)."""
    with override(spread=False):
        yield


def spread_runs() -> int:
    """Launches so far that spread a context's splits: the stack's and the layered
    attention kernel's (a forward the caller watches may have a serial variant)."""
    from mmserve.kernels.triton_attention import SPREAD

    return runs() + int(SPREAD["runs"])


def fits_one_wave(hidden: int, qkv: int, inter: int, kv_heads: int, device) -> bool:
    """Whether every phase's tiles fit one program per SM, as on the model it was measured
    on (SmolLM2-135M: 96 tiles at most); wider models keep the layered kernels until the
    looping grid is measured."""
    from mmserve.kernels.triton_decode_stack import widest_phase

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return widest_phase(hidden, qkv, inter, kv_heads) <= sms


def whole_cache(kv) -> torch.Tensor | None:
    """The (L, 2, blocks, bs, Hkv, D) tensor behind a cache, a KVCache or a plain tensor
    (an fp8 one is excluded by its dtype in ``applies``)."""
    return kv if isinstance(kv, torch.Tensor) else getattr(kv, "data", None)


def applies(x: torch.Tensor, kv, layers: nn.ModuleList, rows: int | None = None) -> bool:
    """Whether a step of ``x`` (N, H) runs as one persistent launch: at most ``MAX_ROWS``
    tokens, the model stacked its layers when it was placed (``ready``) and the step takes
    the fused kernels. ``rows``: the step's token count, where x is the embedding table
    its rows will be gathered from (``run``'s ``ids``)."""
    rows = x.shape[0] if rows is None else rows
    settings = current()
    if not (
        settings.decode_stack
        and 0 < rows <= min(settings.decode_stack_rows, MAX_ROWS)
        and ready(layers)
        and use_triton(x)
        and x.dtype == torch.bfloat16
        and fused._fused_gemm(x, x.shape[-1])
    ):
        return False
    cache = whole_cache(kv)
    return cache is not None and cache.dtype == x.dtype and cache.is_contiguous()


def stacked_weights(layers: nn.ModuleList) -> dict[str, torch.Tensor]:
    """The layers' weights as (L, ...) tensors; built once, the layers then view into them
    (call it before anything keeps a weight's address, as ``CausalLM.placed`` does)."""
    cached = layers.__dict__.get("_stacked")
    if cached is not None:
        return cached
    out = {}
    for name, path in STACKED:
        params = [_attr(layer, path) for layer in layers]
        full = torch.stack([p.data for p in params])
        for i, p in enumerate(params):
            p.data = full[i]
        out[name] = full
    layers.__dict__["_stacked"] = out
    return out


def _attr(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def ready(layers: nn.ModuleList) -> bool:
    """The stack was built when the model was placed (``CausalLM.placed``): built later,
    the rebinding would move weights that captured CUDA graphs still read."""
    return layers.__dict__.get("_stacked") is not None


def run(
    x: torch.Tensor,
    layers: nn.ModuleList,
    positions: torch.Tensor,
    meta,
    kv,
    rope,
    *,
    heads: int,
    kv_heads: int,
    eps: float,
    scale: float,
    ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every layer for the step's tokens x (N, H) -> the residual stream after the last.
    ``ids``: the step's (N,) token ids, x the embedding table they index (the gather runs
    in the stack's input kernel)."""
    from mmserve.kernels.triton_attention import paged_metadata
    from mmserve.kernels.triton_decode_stack import decode_stack

    cache = whole_cache(kv)
    assert cache is not None
    _counts["runs"] += 1
    pm = paged_metadata(meta, cache.shape[3])
    return decode_stack(
        x,
        stacked_weights(layers),
        cache,
        rope.cos,
        rope.sin,
        positions,
        pm.slot_mapping,
        pm.block_tables,
        pm.context_lens,
        pm.query_start,
        pm.query_lens,
        pm.max_query_len,
        heads=heads,
        kv_heads=kv_heads,
        eps=eps,
        scale=scale,
        ids=ids,
    )
