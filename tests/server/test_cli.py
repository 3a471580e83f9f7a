"""The ``mmserve`` CLI: every subcommand has ``--help``; ``serve`` starts, answers, stops."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from live_server import last_json, start_stream

from mmserve.cli import build_parser, config_from, main
from mmserve.config import EngineConfig, ServerConfig

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["serve", "pull", "chat", "generate"])
def test_help_exits_zero(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert f"mmserve {command}" in capsys.readouterr().out


def test_flags_map_one_to_one_onto_config_fields() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "m.gguf",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--num-kv-blocks",
            "64",
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "128",
            "--kv-cache-memory-mb",
            "64",
            "--no-enable-prefix-caching",
            "--host",
            "0.0.0.0",
            "--port",
            "9000",
            "--api-key",
            "k",
            "--served-model-name",
            "mine",
            "--tool-call-parser",
            "auto",
        ]
    )
    engine = config_from(EngineConfig, args)
    server = config_from(ServerConfig, args)
    assert (engine.model, engine.device, engine.dtype, engine.max_model_len) == (
        "m.gguf",
        "cpu",
        "float32",
        256,
    )
    assert (engine.num_kv_blocks, engine.max_num_seqs, engine.max_num_batched_tokens) == (
        64,
        4,
        128,
    )
    assert engine.kv_cache_memory_mb == 64 and engine.enable_prefix_caching is False
    assert engine.block_size == EngineConfig().block_size  # omitted flags keep the defaults
    assert (server.host, server.port, server.api_key, server.served_model_name) == (
        "0.0.0.0",
        9000,
        "k",
        "mine",
    )
    assert server.tool_call_parser == "auto" and server.reasoning_parser is None
    defaults = config_from(EngineConfig, argparse.Namespace())
    assert defaults == EngineConfig()


def test_bad_flag_value_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--device", "tpu"]) == 2
    assert "device must be" in capsys.readouterr().err


def test_serve_subprocess_prints_address_answers_health_and_stops() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mmserve.cli",
            "serve",
            "--port",
            "0",
            "--device",
            "cpu",
            "--max-model-len",
            "256",
            "--served-model-name",
            "tiny",
            "--log-level",
            "warning",
            "--shutdown-grace-s",
            "1",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + 240
        assert proc.stdout is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"serving tiny on (http://[\d.]+:\d+)", line)
            url = found.group(1) if found else None
        assert url is not None, "serve never printed where it listens"
        assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}
        assert httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"] == "tiny"
        _check_default_voice(url)
        # SIGTERM with a stream in flight: past the 1 s grace the stream is cancelled with
        # an error event, and the exit line says its blocks came back
        stream, client = start_stream(url, 200)
        proc.send_signal(signal.SIGTERM)
        client.join(timeout=60)
        assert proc.wait(timeout=60) == 0
        lines += proc.stdout.readlines()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = last_json(stream.events)["error"]
    assert err["code"] == "engine_unavailable" and "shutting down" in err["message"]
    assert "mmserve: stopped; 1 request(s) cancelled at shutdown, 0 KV block(s) in use\n" in (
        lines
    ), "".join(lines)


def _check_default_voice(url: str) -> None:
    """With the default voice installed, the flagless server answers Realtime sessions in
    audio (issue 50.2); without it, in text."""
    import json

    from websockets.sync.client import connect

    from tts.registry import DEFAULT_VOICE_DIR

    voiced = (DEFAULT_VOICE_DIR / "voice.json").is_file()
    with connect(url.replace("http://", "ws://") + "/v1/realtime?model=tiny") as ws:
        created = json.loads(ws.recv(timeout=60))
    assert created["type"] == "session.created"
    assert created["session"]["output_modalities"] == (["audio"] if voiced else ["text"])


def test_pull_lists_and_returns_the_cached_model(capsys: pytest.CaptureFixture[str]) -> None:
    from mmserve.config import DEFAULT_MODEL

    assert main(["pull", "--list"]) == 0
    assert DEFAULT_MODEL in capsys.readouterr().out.split()
    assert main(["pull", "no-such-model"]) == 2
    assert main(["pull"]) == 0
    assert Path(capsys.readouterr().out.strip().splitlines()[-1]).is_dir()


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmserve.cli", *args],
        input=stdin,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_generate_and_chat_print_the_model_text() -> None:
    flags = ("--device", "cpu", "--max-model-len", "256", "--max-tokens", "6", "--temperature", "0")
    gen = _cli("generate", "The capital of France is", *flags)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.strip()
    chat = _cli("chat", *flags, stdin="Hi!\nAnd again?\n\n")
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.count("> ") >= 2 and "chatting with" in chat.stdout
