"""One configuration surface: every knob a config field or an ``envs`` variable, each in
docs/configuration.md; the kernels' settings one frozen object, changed only by
``settings.override`` (which puts the previous object back)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from mmserve import envs
from mmserve.config import EngineConfig, ServerConfig, SpeechConfig
from mmserve.kernels import settings
from mmserve.speculative.config import SpecConfig

ROOT = Path(__file__).resolve().parents[1]


def test_every_field_and_variable_is_in_the_reference():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for cls in (EngineConfig, ServerConfig, SpeechConfig, SpecConfig):
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in doc, (cls.__name__, f.name)
    for name in envs.ENV_VARS:
        assert f"| `{name}` |" in doc, name


def test_only_envs_reads_mmserve_variables():
    """No module reads an ``MMSERVE_*`` variable itself (the table is the one place)."""
    out = subprocess.run(
        [
            "git",
            "grep",
            "-n",
            "-E",
            r"environ[^\n]*MMSERVE_|getenv\(.MMSERVE_",
            "--",
            "mmserve",
            "connectors",
            "tts",
            "parsers",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode not in (0, 1):  # not a git checkout
        pytest.skip("git grep unavailable")
    hits = [line for line in out.stdout.splitlines() if not line.startswith("mmserve/envs.py")]
    assert not hits, hits


def test_variables_are_typed_and_read_when_asked(monkeypatch):
    monkeypatch.setenv("MMSERVE_FUSED", "0")
    assert envs.MMSERVE_FUSED is False
    monkeypatch.setenv("MMSERVE_FUSED", "1")
    assert envs.MMSERVE_FUSED is True
    monkeypatch.delenv("MMSERVE_PDL", raising=False)
    assert envs.MMSERVE_PDL is True
    monkeypatch.setenv("MMSERVE_HOME", "/tmp/somewhere")
    assert envs.MMSERVE_HOME == Path("/tmp/somewhere")
    monkeypatch.setenv("MMSERVE_Q8_HEAD", "0")
    assert settings.KernelConfig.from_env().q8_head is False
    with pytest.raises(AttributeError):
        _ = envs.MMSERVE_NOT_A_VARIABLE


def test_kernel_settings_are_frozen_and_overrides_restore():
    before = settings.current()
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.fused = False  # type: ignore[misc]
    with settings.override(fused=False, stack={"bk": 128}) as inside:
        assert settings.current() is inside
        assert not inside.fused and inside.stack.bk == 128
        assert inside.stack.defer == before.stack.defer
    assert settings.current() is before
    with pytest.raises(ValueError, match="decode_stack_rows"):
        settings.KernelConfig(decode_stack_rows=17)


def test_no_module_flips_a_kernel_switch():
    """Kernel modules keep no ``set_*`` switches and no mutable settings dicts."""
    out = subprocess.run(
        ["git", "grep", "-n", "-E", r"^def set_|^_state\b|^TUNING\b", "--", "mmserve/kernels"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode not in (0, 1):
        pytest.skip("git grep unavailable")
    assert not out.stdout.strip(), out.stdout
    assert not re.search(
        r"MMSERVE_(ROPE_ATTENTION|O_GROUPS)", (ROOT / "mmserve" / "envs.py").read_text()
    )


@pytest.mark.parametrize(
    ("given", "cuda", "cpus", "layout"),
    [
        ({}, True, 16, (True, 4)),  # a GPU: the core in its own process, API servers
        ({}, True, 2, (True, 1)),
        ({}, False, 16, (False, 1)),  # a CPU: one process
        ({"engine_process": False}, True, 16, (False, 1)),
        ({"api_server_count": 2}, False, 2, (True, 2)),  # > 1 implies the core's process
        ({"engine_process": True}, False, 16, (True, 1)),
    ],
)
def test_the_process_layout_left_unset_follows_the_device(given, cuda, cpus, layout):
    resolved = ServerConfig(**given).resolve_layout(cuda, cpus)
    assert (resolved.engine_process, resolved.api_server_count) == layout
    assert resolved.split == layout[0]


def test_several_api_servers_need_the_core_process():
    with pytest.raises(ValueError, match="engine-core process"):
        ServerConfig(engine_process=False, api_server_count=2).resolve_layout(True, 16)
