"""Engine sizes left unset (``None`` in ``EngineConfig``), chosen from the device and model.

The rule (docs: README "Engine sizes"):

* CPU: 32 sequences, 512 tokens a step, 512 MiB of KV. A CPU step's cost grows with
  every token in it, so small steps keep streams responsive; tests and laptops want
  small allocations.
* CUDA, from the device's total memory ``T``:
  - ``max_num_seqs`` 256 (the scale vLLM and SGLang serve at); 128 when ``T`` < 16 GiB.
    Decode graphs are captured for every size of ``DEFAULT_SIZES`` up to it.
  - ``max_num_batched_tokens`` 8192 when ``T`` >= 40 GiB, 4096 when >= 16 GiB, else
    2048: a step's prefill activations scale with it, and bigger steps amortise the
    weight reads of a prefill over more tokens.
  - KV memory: ``kv_cache_memory_fraction`` (default 0.5) of the memory available once the
    weights are loaded (the driver's free memory plus what torch has cached but not
    handed out), capped at what ``max_num_seqs`` sequences of ``max_model_len`` tokens
    can ever use, and at least ``MIN_KV_MB``. Half, not vLLM's 90 %, because the same GPU
    also holds the CUDA graphs' pools, prefill activations, the vision connector and the
    voice engine, all allocated after the KV cache.

Values set explicitly are never changed.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import NamedTuple

import torch

from mmserve.config import EngineConfig

log = logging.getLogger("mmserve")

GiB = 1 << 30
MiB = 1 << 20
CPU_SIZES = (32, 512, 512)  # (max_num_seqs, max_num_batched_tokens, kv_cache_memory_mb)
MIN_KV_MB = 64


class DeviceMemory(NamedTuple):
    """``total``: the device's memory; ``available``: what a new allocation can still get."""

    total: int
    available: int


class Sizes(NamedTuple):
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_memory_mb: int


def device_memory(device: torch.device) -> DeviceMemory | None:
    """The CUDA device's memory (None on CPU)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return DeviceMemory(total, free + cached)


def choose_sizes(
    config: EngineConfig, memory: DeviceMemory | None, kv_bytes_per_token: int, max_model_len: int
) -> Sizes:
    """The sizes the module docstring's rule gives; explicit config values win."""
    if memory is None:
        seqs, tokens, kv_mb = CPU_SIZES
    else:
        seqs = 256 if memory.total >= 16 * GiB else 128
        tokens = 8192 if memory.total >= 40 * GiB else 4096 if memory.total >= 16 * GiB else 2048
        if config.max_num_seqs is not None:
            seqs = config.max_num_seqs
        useful = seqs * max_model_len * kv_bytes_per_token  # more is never used
        share = int(memory.available * config.kv_cache_memory_fraction)
        kv_mb = max(MIN_KV_MB, min(share, useful) // MiB)
    return Sizes(
        config.max_num_seqs or seqs,
        config.max_num_batched_tokens or tokens,
        config.kv_cache_memory_mb or kv_mb,
    )


def resolve_sizes(
    config: EngineConfig, device: torch.device, kv_bytes_per_token: int, max_model_len: int
) -> tuple[EngineConfig, Sizes]:
    """``config`` with its unset sizes chosen (logged when any was), and those sizes."""
    unset = [f for f in Sizes._fields if getattr(config, f) is None]
    memory = device_memory(device) if unset else None
    sizes = choose_sizes(config, memory, kv_bytes_per_token, max_model_len)
    if not unset:
        return config, sizes
    where = (
        "cpu"
        if memory is None
        else (f"{memory.total / GiB:.0f} GiB device, {memory.available / GiB:.1f} GiB available")
    )
    log.info(
        "engine defaults for %s: %s", where, ", ".join(f"{f}={getattr(sizes, f)}" for f in unset)
    )
    return dataclasses.replace(config, **{f: getattr(sizes, f) for f in unset}), sizes
