"""The demos run against a live server with ``--base-url`` and print the model's text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from live_server import LiveServer

DEMOS = Path(__file__).resolve().parents[2] / "demos"


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEMOS / script), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_chat_stream_demo(server: LiveServer) -> None:
    done = _run("chat_stream.py", "--base-url", f"{server.url}/v1", "--max-tokens", "8", "Say hi.")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and "generated tokens" in done.stderr


def test_realtime_text_demo(server: LiveServer) -> None:
    done = _run(
        "realtime_text.py",
        "--base-url",
        f"{server.url}/v1",
        "--max-output-tokens",
        "6",
        "Hello!",
        "Again?",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("> ") == 2 and done.stderr.count("tokens]") == 2
