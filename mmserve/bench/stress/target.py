"""The server under stress: its address, and what can be read of it from outside.

A ``Target`` is a server on 127.0.0.1 that this process started, either as a child
process (``spawn``: ``mmserve serve`` on a free port, so its RSS is its own) or in a
thread (tests pass an address and the in-process engine's ``stats``). KV blocks in
use are read from ``/metrics``, RSS from the process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

import httpx
import psutil

_BLOCKS = re.compile(r"^mmserve_kv_blocks_used\{[^}]*\} ([0-9.e+]+)$", re.M)
_ANNOUNCE = re.compile(r"serving \S+ on http://127\.0\.0\.1:(\d+)")


@dataclass
class Target:
    url: str
    pid: int
    blocks: Callable[[], int] | None = None  # None: read /metrics
    proc: subprocess.Popen[str] | None = field(default=None, repr=False)

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    def blocks_used(self) -> int:
        if self.blocks is not None:
            return self.blocks()
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        match = _BLOCKS.search(text)
        return int(float(match.group(1))) if match else -1

    def rss_mb(self) -> float:
        return psutil.Process(self.pid).memory_info().rss / 2**20

    def alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            return False
        try:
            return httpx.get(f"{self.url}/health", timeout=30).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_idle(self, timeout: float = 120.0) -> int:
        """Blocks in use once the server has settled (0 on an idle server)."""
        deadline = time.monotonic() + timeout
        used = self.blocks_used()
        while used and time.monotonic() < deadline:
            time.sleep(0.25)
            used = self.blocks_used()
        return used

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def spawn(
    flags: list[str],
    startup_s: float = 300.0,
    log_path: str | None = None,
    log_level: str = "warning",
) -> Target:
    """Start ``mmserve serve --host 127.0.0.1 --port 0 FLAGS`` and wait for its address;
    its output goes to ``log_path`` (None: nowhere)."""
    cmd = [
        sys.executable,
        "-m",
        "mmserve.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--log-level",
        log_level,
        *flags,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + startup_s
    assert proc.stdout is not None
    sink = open(log_path or os.devnull, "w")  # noqa: SIM115 - closed by the pump
    for line in proc.stdout:
        sink.write(line)
        match = _ANNOUNCE.search(line)
        if match:
            target = Target(f"http://127.0.0.1:{match.group(1)}", proc.pid, proc=proc)
            _drain(proc, sink)
            return target
        if time.monotonic() > deadline:
            break
    proc.kill()
    sink.close()
    raise RuntimeError(f"the server did not start (its output: {log_path or 'not kept'})")


def _drain(proc: subprocess.Popen[str], sink: TextIO) -> None:
    """Keep reading the child's output into ``sink`` so a full pipe never blocks it."""
    import threading

    def pump() -> None:
        assert proc.stdout is not None
        with sink:
            for line in proc.stdout:
                sink.write(line)
                sink.flush()

    threading.Thread(target=pump, daemon=True).start()
