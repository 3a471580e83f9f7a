"""The clients of ``mmserve bench serve``: real SDK streams and Realtime sockets, timed.

A load is ``clients`` concurrent clients in a closed loop, each sending its next request
when its last one ends, until the load's requests are all sent. Two kinds:

* ``sse``: the ``openai`` SDK's ``chat.completions.create(stream=True)`` with
  ``stream_options.include_usage`` and ``ignore_eos`` (mmserve's extension, through
  ``extra_body``), so every request generates exactly ``max_tokens`` tokens;
* ``ws``: one ``websockets`` connection a client to ``/v1/realtime``, each request an
  out-of-band ``response.create`` (``conversation: "none"``) with the same messages.

A request's TTFT is from just before it is sent to its first text; its gaps are the times
between successive arrivals of text (what a reader of the stream sees: tokens that
arrived in one event count as one arrival). A load can be split over several client
processes (``run_load``): one Python process parsing SDK chunks saturates long before a
GPU server does, and the JSON says how busy each client process was.

This module imports no torch (client processes stay light).
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field

from mmserve import envs

Messages = list[dict[str, str]]


@dataclass
class Load:
    """One client process's share of a load."""

    url: str  # http://host:port
    model: str
    kind: str  # "sse" | "ws"
    clients: int
    requests: int  # this share's requests (>= clients)
    prompts: list[Messages]  # request i sends prompts[i % len(prompts)]
    max_tokens: int
    start_at: float = 0.0  # time.monotonic() at which to begin (shares start together)


@dataclass
class Timing:
    """One request, seconds on the ``time.monotonic`` clock (system-wide on Linux)."""

    start: float
    ttft: float | None = None
    end: float = 0.0
    tokens: int = 0  # the server's count (usage)
    gaps: list[float] = field(default_factory=list)
    error: str | None = None


@dataclass
class ShareResult:
    timings: list[Timing]
    cpu_s: float  # the client process's CPU time over the share
    wall_s: float


async def _sse_request(client, load: Load, messages: Messages) -> Timing:
    t = Timing(time.monotonic())
    last = None
    stream = await client.chat.completions.create(
        model=load.model,
        messages=messages,
        max_tokens=load.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        now = time.monotonic()
        if chunk.choices and chunk.choices[0].delta.content:
            if last is None:
                t.ttft = now - t.start
            else:
                t.gaps.append(now - last)
            last = now
        if chunk.usage is not None:
            t.tokens = chunk.usage.completion_tokens
    t.end = time.monotonic()
    return t


async def _ws_request(ws, load: Load, messages: Messages) -> Timing:
    system = next((m["content"] for m in messages if m["role"] == "system"), None)
    items = [
        {
            "type": "message",
            "role": m["role"],
            "content": [{"type": "input_text", "text": m["content"]}],
        }
        for m in messages
        if m["role"] != "system"
    ]
    response: dict = {"conversation": "none", "input": items, "max_output_tokens": load.max_tokens}
    if system is not None:
        response["instructions"] = system
    t = Timing(time.monotonic())
    last = None
    await ws.send(json.dumps({"type": "response.create", "response": response}))
    while True:
        event = json.loads(await ws.recv())
        kind = event["type"]
        now = time.monotonic()
        if kind == "response.output_text.delta" and event.get("delta"):
            if last is None:
                t.ttft = now - t.start
            else:
                t.gaps.append(now - last)
            last = now
        elif kind == "response.done":
            resp = event["response"]
            t.tokens = (resp.get("usage") or {}).get("output_tokens", 0)
            details = resp.get("status_details") or {}
            # a fixed-length answer ends "incomplete" at its token limit: that is its end
            if resp.get("status") != "completed" and details.get("reason") != "max_output_tokens":
                t.error = f"response {resp.get('status')}: {details}"
            break
        elif kind == "error":
            t.error = str(event.get("error"))
            break
    t.end = time.monotonic()
    return t


async def _ws_open(load: Load):
    from websockets.asyncio.client import connect

    ws = await connect(
        load.url.replace("http://", "ws://", 1) + "/v1/realtime",
        max_size=None,
        open_timeout=120,
        ping_interval=None,
    )
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created", created
    await ws.send(
        json.dumps(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "output_modalities": ["text"],
                    "temperature": 0,
                    "ignore_eos": True,
                },
            }
        )
    )
    while json.loads(await ws.recv())["type"] != "session.updated":
        pass
    return ws


async def _client_loop(load: Load, counter: list[int], out: list[Timing], sse) -> None:
    """One client: requests back to back until the share's requests are all sent."""
    ws = None if load.kind == "sse" else await _ws_open(load)
    try:
        while counter[0] < load.requests:
            i = counter[0]
            counter[0] += 1
            messages = load.prompts[i % len(load.prompts)]
            start = time.monotonic()
            try:
                if ws is None:
                    out.append(await _sse_request(sse, load, messages))
                else:
                    out.append(await _ws_request(ws, load, messages))
            except Exception as exc:  # noqa: BLE001 - counted and reported, the load goes on
                out.append(Timing(start, end=time.monotonic(), error=repr(exc)[:300]))
    finally:
        if ws is not None:
            await ws.close()


async def _run_share(load: Load) -> list[Timing]:
    from openai import AsyncOpenAI

    # the SDK's own HTTP client and pool (1,000 connections, 100 kept alive: more than
    # one client process's share of the largest load)
    sse = AsyncOpenAI(
        base_url=load.url + "/v1",
        api_key=envs.MMSERVE_API_KEY or "x",
        timeout=600.0,
        max_retries=0,
    )
    delay = load.start_at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    out: list[Timing] = []
    counter = [0]
    try:
        await asyncio.gather(*(_client_loop(load, counter, out, sse) for _ in range(load.clients)))
    finally:
        await sse.close()
    return out


_CANNED_CHUNKS = (
    {"role": "assistant", "content": "Once"},
    {"content": " upon"},
)


async def _canned_sse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A chat-completions SSE answer of two content chunks, usage and [DONE], whatever
    was asked: what ``warm_client`` points the SDK at."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(v)
            for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
            if k.strip().lower() == b"content-length"
        ),
        0,
    )
    await reader.readexactly(length)
    base = {"id": "warm", "object": "chat.completion.chunk", "created": 0, "model": "warm"}
    events = [
        {**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
        for d in _CANNED_CHUNKS
    ]
    events.append(
        {
            **base,
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }
    )
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body += b"data: [DONE]\n\n"
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    writer.close()


def warm_client() -> None:
    """Run the SSE client's whole path once against a canned local answer, so a client
    process's first-use costs (the SDK's lazy imports and first parse: tens of ms) are
    paid before any load, and a fresh server's first requests time the server alone."""

    async def once() -> None:
        server = await asyncio.start_server(_canned_sse, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            msgs = [{"role": "user", "content": "hi"}]
            load = Load(f"http://127.0.0.1:{port}", "warm", "sse", 1, 1, [msgs], 2)
            (t,) = await _run_share(load)
            assert t.error is None and t.tokens == 2, t
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(once())


def run_share(load: Load) -> ShareResult:
    """Run one share of a load in this process (a client process's entry point)."""
    cpu, wall = time.process_time(), time.monotonic()
    timings = asyncio.run(_run_share(load))
    return ShareResult(timings, time.process_time() - cpu, time.monotonic() - wall)


def split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal non-negative integers (larger ones first)."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def run_load(load: Load, pool: Executor | None, procs: int) -> list[ShareResult]:
    """The load over ``procs`` client processes of ``pool`` (None or 1: this process);
    every share starts at one moment, so the load is applied at once."""
    procs = max(1, min(procs, load.clients))
    if pool is None or procs == 1:
        return [run_share(load)]
    clients = split(load.clients, procs)
    # every client the same number of requests (give or take one), whichever share it is
    # in: shares of requests cut apart from their clients would leave some clients a
    # last request to run alone at the load's end, a tail at a fraction of the batch
    per_client = split(load.requests, load.clients)
    ends = [sum(clients[: i + 1]) for i in range(procs)]
    requests = [sum(per_client[e - c : e]) for c, e in zip(clients, ends, strict=True)]
    start_at = time.monotonic() + 0.3  # every share's process is running by then
    offsets = [sum(requests[:i]) % len(load.prompts) for i in range(procs)]
    shares = [
        Load(
            load.url,
            load.model,
            load.kind,
            c,
            r,
            load.prompts[o:] + load.prompts[:o],
            load.max_tokens,
            start_at,
        )
        for c, r, o in zip(clients, requests, offsets, strict=True)
    ]
    return list(pool.map(run_share, shares))
