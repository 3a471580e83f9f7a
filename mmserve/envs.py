"""Every environment variable mmserve reads, in one typed table.

Everything else a user can set is a field of the config dataclasses (``mmserve.config``,
one CLI flag each). The variables here are what a config object cannot carry: where the
model store lives (shared by every process, the tests' fixtures included), a secret kept
off the command line, and the kernel switches that pick which implementation computes
the same bits (``KernelConfig``'s defaults, for comparisons on one machine; the engine
installs the resulting frozen object once, ``mmserve.kernels.settings``).

Each is read when it is asked for (``envs.MMSERVE_HOME``), never cached at import, so a
test's ``monkeypatch.setenv`` takes effect.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    MMSERVE_HOME: Path
    MMSERVE_API_KEY: str | None
    MMSERVE_TRITON: bool
    MMSERVE_FUSED: bool
    MMSERVE_QKV_ROPE: bool
    MMSERVE_DECODE_STACK: bool
    MMSERVE_PDL: bool
    MMSERVE_COPY_KERNEL: bool
    MMSERVE_Q8_HEAD: bool


class EnvVar(NamedTuple):
    """One variable: how its text is read, and what it means (docs/configuration.md)."""

    read: Callable[[str | None], Any]
    default: str  # as documented
    help: str


def _flag(default: bool) -> Callable[[str | None], bool]:
    """A switch: unset keeps ``default``; "0" (or false/off/no) is off, anything else on."""

    def read(value: str | None) -> bool:
        if value is None or value.strip() == "":
            return default
        return value.strip().lower() not in ("0", "false", "off", "no")

    return read


def _home(value: str | None) -> Path:
    return Path(value or Path.home() / ".cache" / "mmserve").expanduser()


ENV_VARS: dict[str, EnvVar] = {
    "MMSERVE_HOME": EnvVar(
        _home, "~/.cache/mmserve", "model store: downloads, converted models, locks, voice training"
    ),
    "MMSERVE_API_KEY": EnvVar(
        lambda v: v or None, "unset", "API key when --api-key is not given (unset: routes open)"
    ),
    "MMSERVE_TRITON": EnvVar(
        _flag(True), "1", "0: every kernel on CUDA runs its plain-torch reference"
    ),
    "MMSERVE_FUSED": EnvVar(
        _flag(True), "1", "0: the fused layer kernels run as their unfused composition"
    ),
    "MMSERVE_QKV_ROPE": EnvVar(
        _flag(True), "1", "0: rope and the cache write after the QKV product, not in it"
    ),
    "MMSERVE_DECODE_STACK": EnvVar(
        _flag(True), "1", "0: small steps run layer by layer, not as one launch"
    ),
    "MMSERVE_PDL": EnvVar(_flag(True), "1", "0: no programmatic dependent launch (sm_90+)"),
    "MMSERVE_COPY_KERNEL": EnvVar(
        _flag(True), "1", "0: a step's small host/device copies as DMA copies"
    ),
    "MMSERVE_Q8_HEAD": EnvVar(
        _flag(True), "1", "0: the LM head reads its bf16 weight, not its Q8_0 blocks"
    ),
}


def __getattr__(name: str) -> Any:
    var = ENV_VARS.get(name)
    if var is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return var.read(os.environ.get(name))


def __dir__() -> list[str]:
    return sorted([*globals(), *ENV_VARS])
