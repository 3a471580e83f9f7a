"""Session fixtures: the real default model in one engine, served live on 127.0.0.1.

One engine serves two apps: an open one and one with ``--api-key``. Tests that
need the queue to overflow get their own tiny engine (one running sequence,
one waiting slot) so the 429 is deterministic.

``MMSERVE_TEST_ENGINE=process`` serves the session engine from an engine-core process of
its own (``mmserve serve --engine-process``) instead of a thread, so the same tests hold
the split to the in-process behaviour (tests that read ``AsyncEngine`` internals or build
their own engine still use the in-process one).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from live_server import LiveServer

from mmserve.config import EngineConfig, ServerConfig

MAX_MODEL_LEN = 512
API_KEY = "sk-mmserve-test"


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    from mmserve.engine.async_engine import AsyncEngine

    config = EngineConfig(
        device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=32, max_waiting=64
    )
    if os.environ.get("MMSERVE_TEST_ENGINE") == "process":
        from mmserve.server.launch_split import spawn_engine

        eng: Any = spawn_engine(config)
    else:
        eng = AsyncEngine.from_config(config)
    yield eng
    eng.shutdown_sync()


@pytest.fixture(scope="session")
def server(engine: Any) -> Iterator[LiveServer]:
    config = ServerConfig(host="127.0.0.1", port=0, log_level="warning")
    with LiveServer(engine, config) as srv:
        yield srv


@pytest.fixture(scope="session")
def auth_server(engine: Any) -> Iterator[LiveServer]:
    config = ServerConfig(host="127.0.0.1", port=0, log_level="warning", api_key=API_KEY)
    with LiveServer(engine, config) as srv:
        yield srv


@pytest.fixture(scope="session")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model_name(engine: Any) -> str:
    return str(engine.model_name)


def chat_messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]
