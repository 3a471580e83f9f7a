"""ruff and mypy, as configured in pyproject.toml, pass on the shipped code."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_ruff_passes():
    out = _run("ruff", "check", "mmserve", "parsers", "connectors", "tts", "tests", "bench")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_passes():
    out = _run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr
