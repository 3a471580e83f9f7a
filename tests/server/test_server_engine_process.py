"""``mmserve serve --engine-process --api-server-count 2``: the real command, real model.

The step loop runs in an engine-core process, two API servers accept on one port, and
every test talks to it as a client would (the ``openai`` SDK, httpx, the Realtime
WebSocket): usage, 429s, cancellation, tool-call parsing and Realtime events must behave
as in-process, and a core killed mid-stream must end the stream with an error, not hang.
One running and one waiting slot make the 429 deterministic; the core is killed last.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "Hi"}]
STORY = [{"role": "user", "content": "Tell me a story."}]
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


class Served:
    """The launched command: its URL, the core's pid, and its output so far."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines = proc, []
        self.url, self.core_pid = "", 0
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if m := re.search(r"engine core running in process (\d+)", line):
                self.core_pid = int(m.group(1))
            if m := re.search(r"serving \S+ on (http://\S+)", line):
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    def wait(self, timeout: float) -> None:
        if not self._ready.wait(timeout) or not self.url:
            raise RuntimeError("the server did not start:\n" + "".join(self.lines))

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return {
            s.name: s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if not s.labels or set(s.labels) == {"model"}
        }

    def wait_idle(self, used: float, timeout: float = 30.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if (
                m["mmserve_num_requests_running"],
                m["mmserve_num_requests_waiting"],
                m["mmserve_kv_blocks_used"],
            ) == (0, 0, used):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"the core did not return to idle: {m}")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    cmd = [
        sys.executable,
        "-m",
        "mmserve.cli",
        "serve",
        "--engine-process",
        "--api-server-count",
        "2",
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--voice",
        "none",
        "--connector",
        "none",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        "1",
        "--max-waiting",
        "1",
        "--tool-call-parser",
        "hermes",
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env
    )
    srv = Served(proc)
    try:
        srv.wait(timeout=300)
        yield srv
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def sdk(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0, timeout=120)


def test_two_api_servers_and_one_core(served: Served) -> None:
    pid = served.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert str(served.core_pid) in children
    names = [Path(f"/proc/{c}/cmdline").read_bytes() for c in children]
    assert sum(b"multiprocessing.spawn" in n for n in names) >= 2  # the core + API server 2
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok"}


def test_every_scrape_counts_the_requests_of_both_api_servers(served: Served) -> None:
    """A scrape lands on one API server; its counters are still the sum over both (each
    server counted only its own, so scrapes jumped between the two counts)."""

    def models_served() -> float:
        text = httpx.get(f"{served.url}/metrics", timeout=30).text  # a new connection
        return sum(
            s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "mmserve_requests_total"
            and s.labels.get("endpoint") == "/v1/models"
            and s.labels.get("status") == "200"
        )

    before = models_served()
    for _ in range(24):  # each on a new connection: both servers answer some
        assert httpx.get(f"{served.url}/v1/models", timeout=30).status_code == 200
    deadline = time.monotonic() + 10
    while models_served() != before + 24 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [models_served() for _ in range(8)] == [before + 24] * 8


def test_connections_spread_over_both_api_servers(served: Served) -> None:
    """32 keep-alive connections: each API server holds some (on one shared socket, the
    first server to wake took nearly all of a burst)."""
    import psutil

    port = int(served.url.rsplit(":", 1)[1])
    clients = [httpx.Client(base_url=served.url) for _ in range(32)]
    try:
        for c in clients:
            assert c.get("/health").status_code == 200
        launcher = psutil.Process(served.proc.pid)
        servers = [launcher] + [
            p for p in launcher.children() if p.name().startswith("mmserve-api")
        ]
        held = {
            p.name(): sum(
                c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
                for c in p.net_connections("tcp")
            )
            for p in servers
        }
    finally:
        for c in clients:
            c.close()
    assert sorted(held) == ["mmserve-api-0", "mmserve-api-1"], held
    assert sum(held.values()) == 32, held
    assert min(held.values()) >= 4, held  # a fair split is 16; Binomial(32, 1/2) < 4: 1e-5


def test_usage_and_streamed_text_match_the_whole_answer(sdk: openai.OpenAI) -> None:
    whole = sdk.chat.completions.create(
        model="smollm2-135m-instruct", messages=HI, max_tokens=6, temperature=0
    )
    assert whole.usage is not None and whole.usage.completion_tokens == 6
    assert whole.usage.prompt_tokens > 0
    chunks = list(
        sdk.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=HI,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and not chunks[-1].choices
    assert chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_closed_stream_frees_its_blocks(served: Served, sdk: openai.OpenAI) -> None:
    used = served.wait_idle(served.metrics()["mmserve_kv_blocks_used"])["mmserve_kv_blocks_used"]
    stream = sdk.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=STORY,
        max_tokens=200,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    after = served.wait_idle(used)
    assert after["mmserve_generation_tokens_total"] < 200


def test_full_queue_answers_429(served: Served) -> None:
    url = f"{served.url}/v1/chat/completions"
    body = {
        "messages": STORY,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }

    async def run() -> tuple[int, int, httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as http:

            async def drain() -> int:
                async with http.stream("POST", url, json=body) as r:
                    async for _ in r.aiter_lines():
                        pass
                    return r.status_code

            async def until(name: str) -> None:
                while (await asyncio.to_thread(served.metrics))[name] < 1:
                    await asyncio.sleep(0.02)

            running = asyncio.create_task(drain())
            await until("mmserve_num_requests_running")
            waiting = asyncio.create_task(drain())
            await until("mmserve_num_requests_waiting")
            refused = await http.post(url, json={**body, "stream": False})
            return await running, await waiting, refused

    first, second, refused = asyncio.run(run())
    assert (first, second) == (200, 200)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"


def test_tool_choice_required_streams_a_parsed_call(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": "2 plus 3?"}],
        tools=[ADD],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    name, args, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name += call.function.name or "" if call.function else ""
                args += call.function.arguments or "" if call.function else ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and name == "add"
    assert set(json.loads(args)) == {"a", "b"}


def test_realtime_text_response_and_error_events(served: Served) -> None:
    async def run() -> tuple[list[str], str, Any]:
        client = openai.AsyncOpenAI(
            base_url=f"{served.url}/v1",
            api_key="x",
            max_retries=0,
            websocket_base_url=served.url.replace("http", "ws") + "/v1",
        )
        async with client.realtime.connect(model="smollm2-135m-instruct") as conn:
            kinds = [(await conn.recv()).type]
            await conn.send({"type": "no.such.event"})  # type: ignore[arg-type,typeddict-item]
            error = await asyncio.wait_for(conn.recv(), 60)
            await conn.conversation.item.create(
                item={  # type: ignore[arg-type]
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Say hi."}],
                }
            )
            await conn.response.create(response={"max_output_tokens": 5})
            text = ""
            while kinds[-1] != "response.done":
                event = await asyncio.wait_for(conn.recv(), 60)
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    text += event.delta
            return kinds, text, (error, event)

    kinds, text, (error, done) = asyncio.run(run())
    assert kinds[0] == "session.created" and error.type == "error"
    assert "response.created" in kinds and "response.output_text.delta" in kinds
    assert done.response.output[0].content[0].text == text
    assert done.response.usage.output_tokens == 5


def test_killed_core_ends_the_stream_with_an_error(served: Served, sdk: openai.OpenAI) -> None:
    """Last: the core is gone for good. The stream in flight errors within seconds; then
    /health and new requests answer 503."""
    stream = sdk.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=STORY,
        max_tokens=200,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    start = None
    with pytest.raises(openai.APIError, match="engine has stopped"):
        for i, _ in enumerate(stream):
            if i == 1:
                os.kill(served.core_pid, signal.SIGKILL)
                start = time.monotonic()
    assert start is not None and time.monotonic() - start < 15
    assert httpx.get(f"{served.url}/health").status_code == 503
    with pytest.raises(openai.APIStatusError) as refused:
        sdk.chat.completions.create(model="smollm2-135m-instruct", messages=HI, max_tokens=2)
    assert refused.value.status_code == 503


@pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT balances on Linux")
def test_a_port_another_server_listens_on_is_refused() -> None:
    """SO_REUSEPORT lets a bind join another server's group on its port (same user):
    the launcher refuses a port that is already served, with or without that option,
    while its own API servers still join its group."""
    import socket

    from mmserve.config import ServerConfig
    from mmserve.server.launch_split import listen

    for theirs in (False, True):
        other = socket.socket()
        if theirs:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        config = ServerConfig(host="127.0.0.1", port=other.getsockname()[1])
        with pytest.raises(OSError):
            listen(config, reuse_port=True)
        other.close()
    ours = listen(ServerConfig(host="127.0.0.1", port=0), reuse_port=True)
    port = ours.getsockname()[1]
    joined = listen(ServerConfig(host="127.0.0.1", port=port), reuse_port=True, join=True)
    assert joined.getsockname()[1] == port
    with pytest.raises(OSError):  # a second launcher on the same port
        listen(ServerConfig(host="127.0.0.1", port=port), reuse_port=True)
    joined.close()
    ours.close()
