"""Kernel settings: one frozen object, built by the engine, read by the kernels.

Which implementation computes a kernel's bits on CUDA (Triton or the plain-torch
reference, fused or composed, the whole stack in one launch or a launch a layer, PDL) and
the decode stack's launch settings are fields of ``KernelConfig``. The engine's factory
builds one from its ``EngineConfig`` and the environment (``mmserve.envs``) and
``install``s it before it loads the model; the kernel modules read ``current()`` where
they choose a path. Nothing mutates it: benchmarks and tests compare settings inside
``override(...)``, which installs a changed copy and puts the previous object back on
exit. A captured CUDA graph replays what ran under the settings it was captured with.

Every setting is speed only, except ``batch_invariant`` (a row's bits independent of its
batch): the paths compute the same bits (tests compare them), so no token depends on a
kernel setting.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from mmserve import envs

STACK_MAX_ROWS = 16  # ``triton_decode_stack.MAX_ROWS``: one 16-row GEMM tile


@dataclass(frozen=True)
class StackTuning:
    """The decode stack's launch settings (``triton_decode_stack.decode_stack``); speed
    only, every combination has the default's bits (GPU tests)."""

    unroll: int | None = None  # norm chunks a round (None: ``norm_rounds``)
    num_stages: int = 4  # the kernel's pipeline depth
    bk: int = 256  # K step of the plain products
    bk_gated: int = 256  # K step of the gated (gate/up) product
    bk_exact: bool = True  # K steps that divide K (``k_step``)
    prefetch: bool = True  # the next layer into L2 during phase B
    att_prefetch: int = 1  # ``attention_rows``' PREFETCH mode
    gated_one_dot: bool = True  # gate and up rows as one weight tile
    qkv_rope: bool = True  # rope and the cache write in phase A's epilogue
    early: bool = True  # residuals and cache slots asked for before the product
    defer: bool = True  # the normed phases' operand handed over by the phase before
    gemm_stages: int | None = 5  # the GEMM K loops' depth (None: ``num_stages``)
    att_stages: int | None = 1  # the attention key loop's depth (None: ``num_stages``)
    # "serial": on in the kernel compiled without the spread attention path only
    v_l1: bool | str = "serial"  # values asked into L1 before the keys' load
    k_t: bool | str = "serial"  # keys loaded in the QK operand's orientation
    qkv_hoist: bool = True  # phase A's positions and slots loaded before the layer loop
    pdl: bool = True  # the stack launched by PDL after its input kernel
    # the grid barrier's wait (``triton_grid.poll_asm``: loads in flight, cycles between
    # them, acquire[, cycles before a load is issued again]); () or None: the acquire
    # loop. The kernel compiled with the spread attention path keeps the acquire loop.
    poll: tuple | None = (1, 0, False)


@dataclass(frozen=True)
class KernelConfig:
    """Which kernels run on CUDA, and how they launch. CPU runs the references whatever
    these say, except ``batch_invariant``, which the CPU products honour too."""

    batch_invariant: bool = True  # products of fixed tiles (``linear``); EngineConfig's
    triton: bool = True  # Triton kernels on CUDA (off: the plain-torch references)
    fused: bool = True  # the fused layer ops (off: their composition, ``fused``)
    qkv_rope: bool = True  # rope and the cache write in the QKV product's epilogue
    decode_stack: bool = True  # steps of up to ``decode_stack_rows`` tokens in one launch
    decode_stack_rows: int = STACK_MAX_ROWS  # 1..16 (benchmarks compare against 1)
    pdl: bool = True  # programmatic dependent launch (sm_90+)
    copy_kernel: bool = True  # a step's small host/device copies as one kernel each
    q8_head: bool = True  # the LM head reads its Q8_0 blocks where a model has them
    # a long context's key splits spread over programs of their own (the stack's and the
    # layered attention's); off: each tile's splits in one program (``serial_splits``)
    spread: bool = True
    kv_ahead: bool = True  # small attention grids load keys and values a step ahead
    # ``triton_matmul`` tile shapes: (row-count bucket, (bm, bn, bk, warps, stages)) pairs
    # in place of ``pick_config``'s, and one tile for every Q8_0 head (benchmarks)
    tiles: tuple[tuple[int, tuple[int, int, int, int, int]], ...] = ()
    q8_tile: tuple[int, int, int, int, int] | None = None
    stack: StackTuning = field(default_factory=StackTuning)

    def __post_init__(self) -> None:
        if not 1 <= self.decode_stack_rows <= STACK_MAX_ROWS:
            raise ValueError(
                f"decode_stack_rows must be in [1, {STACK_MAX_ROWS}], got {self.decode_stack_rows}"
            )

    @classmethod
    def from_env(cls, **changes) -> KernelConfig:
        """The defaults, with the switches ``mmserve.envs`` reads, then ``changes``."""
        env = dict(
            triton=envs.MMSERVE_TRITON,
            fused=envs.MMSERVE_FUSED,
            qkv_rope=envs.MMSERVE_QKV_ROPE,
            decode_stack=envs.MMSERVE_DECODE_STACK,
            pdl=envs.MMSERVE_PDL,
            copy_kernel=envs.MMSERVE_COPY_KERNEL,
            q8_head=envs.MMSERVE_Q8_HEAD,
        )
        return cls(**{**env, **changes})


_installed: list[KernelConfig] = [KernelConfig.from_env()]  # [0]: the one in force


def current() -> KernelConfig:
    """The settings in force."""
    return _installed[0]


def install(config: KernelConfig) -> None:
    """Put ``config`` in force (the engine's factory, before it loads a model)."""
    assert isinstance(config, KernelConfig)
    _installed[0] = config


@contextlib.contextmanager
def override(**changes) -> Iterator[KernelConfig]:
    """Within it, the settings in force with ``changes`` (``stack`` may be a dict of
    ``StackTuning`` changes); the previous object is put back on exit."""
    previous = current()
    if isinstance(changes.get("stack"), dict):
        changes["stack"] = dataclasses.replace(previous.stack, **changes["stack"])
    install(dataclasses.replace(previous, **changes))
    try:
        yield current()
    finally:
        install(previous)
