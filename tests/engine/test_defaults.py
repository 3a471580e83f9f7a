"""Engine sizes chosen from the device and the model (``mmserve.engine.defaults``)."""

from __future__ import annotations

import pytest
import torch

from mmserve.config import EngineConfig
from mmserve.engine.defaults import (
    CPU_SIZES,
    MIN_KV_MB,
    DeviceMemory,
    GiB,
    MiB,
    Sizes,
    choose_sizes,
    resolve_sizes,
)

# SmolLM2-135M in bf16: 30 layers x K,V x 3 kv heads x 64 dims x 2 bytes
SMOL_KV_BYTES = 30 * 2 * 3 * 64 * 2


def test_cpu_keeps_small_sizes():
    assert choose_sizes(EngineConfig(), None, SMOL_KV_BYTES, 8192) == Sizes(*CPU_SIZES)
    cfg, sizes = resolve_sizes(EngineConfig(), torch.device("cpu"), SMOL_KV_BYTES, 8192)
    assert sizes == Sizes(32, 512, 512)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.kv_cache_memory_mb) == sizes


def test_a_large_gpu_serves_256_sequences_with_a_multi_thousand_token_budget():
    h100 = DeviceMemory(total=80 * GiB, available=79 * GiB)
    sizes = choose_sizes(EngineConfig(), h100, SMOL_KV_BYTES, 8192)
    assert sizes.max_num_seqs == 256 and sizes.max_num_batched_tokens == 8192
    # half of what is available, below the cap of 256 sequences x 8192 tokens (45 GiB)
    assert sizes.kv_cache_memory_mb == int(79 * GiB * 0.5) // MiB


def test_kv_is_capped_at_what_the_sequences_can_use():
    h100 = DeviceMemory(total=80 * GiB, available=79 * GiB)
    sizes = choose_sizes(EngineConfig(), h100, SMOL_KV_BYTES, 1024)
    assert sizes.kv_cache_memory_mb == 256 * 1024 * SMOL_KV_BYTES // MiB


def test_smaller_gpus_get_smaller_steps_and_a_floor_of_kv():
    mid = choose_sizes(EngineConfig(), DeviceMemory(24 * GiB, 20 * GiB), SMOL_KV_BYTES, 8192)
    assert (mid.max_num_seqs, mid.max_num_batched_tokens) == (256, 4096)
    small = choose_sizes(EngineConfig(), DeviceMemory(8 * GiB, 32 * MiB), SMOL_KV_BYTES, 8192)
    assert (small.max_num_seqs, small.max_num_batched_tokens) == (128, 2048)
    assert small.kv_cache_memory_mb == MIN_KV_MB


def test_explicit_values_win_and_set_the_kv_cap():
    cfg = EngineConfig(max_num_seqs=8, max_num_batched_tokens=300, kv_cache_memory_fraction=0.25)
    gpu = DeviceMemory(80 * GiB, 80 * GiB)
    sizes = choose_sizes(cfg, gpu, SMOL_KV_BYTES, 8192)
    assert sizes[:2] == (8, 300)
    assert sizes.kv_cache_memory_mb == 8 * 8192 * SMOL_KV_BYTES // MiB  # 8 seqs' worth
    fixed = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, kv_cache_memory_mb=100)
    out, sizes = resolve_sizes(fixed, torch.device("cpu"), SMOL_KV_BYTES, 8192)
    assert out is fixed and sizes == Sizes(4, 64, 100)


@pytest.mark.parametrize("bad", [0.0, -0.1, 0.99])
def test_fraction_is_validated(bad):
    with pytest.raises(ValueError, match="kv_cache_memory_fraction"):
        EngineConfig(kv_cache_memory_fraction=bad)
