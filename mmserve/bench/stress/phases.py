"""The stress phases. Each drives a ``Target`` on 127.0.0.1, bounded in count and time,
and returns a ``PhaseResult`` of counts: inputs tried, crashes (the server died or
stopped answering ``/health``), 5xx answers, leaked KV blocks, RSS growth.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from mmserve.bench.stress.schema_fuzz import from_schema, nasty
from mmserve.bench.stress.target import Target
from mmserve.server.protocol import ChatCompletionRequest, CompletionRequest
from mmserve.server.realtime_protocol import CLIENT_EVENTS


@dataclass
class PhaseResult:
    name: str
    inputs: int = 0
    crashes: int = 0
    status_5xx: int = 0
    leaked_blocks: int = 0
    rss_growth_pct: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _schema(model: Any) -> dict[str, Any]:
    return dict(model.model_json_schema())


def _http_inputs() -> st.SearchStrategy[tuple[str, Any]]:
    chat = from_schema(_schema(ChatCompletionRequest))
    cmpl = from_schema(_schema(CompletionRequest))
    raw = st.one_of(
        st.binary(max_size=200),
        st.sampled_from(
            [b"{", b"[]", b"null", b'{"messages": [' * 3, b"\xff\xfe", b'"' + b"a" * 1000]
        ),
    )
    return st.one_of(
        st.tuples(st.just("/v1/chat/completions"), chat),
        st.tuples(st.just("/v1/completions"), cmpl),
        st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), raw),
        st.tuples(st.just("/v1/chat/completions"), nasty()),
    )


class ServerDown(Exception):
    """The server stopped answering ``/health``: the phase ends there."""


def dumps(value: Any) -> str:
    """``json.dumps``, lone surrogates and the fuzzer's 3,000-deep nesting included (the C
    encoder checks Python's recursion limit, which the default of 1,000 would trip)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10_000))
    try:
        return json.dumps(value)
    finally:
        sys.setrecursionlimit(old)


def _run_examples(
    strategy: st.SearchStrategy[Any], n: int, rng_seed: int, test: Callable[[Any], None]
) -> None:
    """``test`` on ``n`` examples of ``strategy``. Hypothesis may end a run before
    ``max_examples`` (examples it discards, a space it has covered), so runs with the
    next seeds continue until ``n`` are done or a run adds none."""
    done = 0

    def counted(value: Any) -> None:
        nonlocal done
        done += 1
        test(value)

    for round_ in range(n):
        before = done
        run = given(strategy)(counted)
        settings(
            max_examples=n - done,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )(run)
        seed(rng_seed + round_)(run)()
        if done >= n or done == before:
            return


def settle(result: PhaseResult, target: Target) -> PhaseResult:
    """End a phase: a crash if the server no longer answers, and the blocks still in use
    once it has settled (so nothing of the phase may be in flight any more)."""
    result.crashes += not target.alive()
    result.leaked_blocks = target.wait_idle()
    return result


def fuzz_http(target: Target, n: int, rng_seed: int = 0, give_up_s: float = 5.0) -> PhaseResult:
    """``n`` fuzzed bodies to the two POST routes; a client gives up on an answer after
    ``give_up_s`` (the server must then abort the request and free its blocks)."""
    return settle(fuzz_http_inputs(target, n, rng_seed, give_up_s), target)


def fuzz_http_inputs(
    target: Target,
    n: int,
    rng_seed: int = 0,
    give_up_s: float = 5.0,
    tick: Callable[[], None] | None = None,
) -> PhaseResult:
    """``fuzz_http``'s inputs alone, from one client, ``tick`` called after each; the
    caller settles the phase (``settle``) once every client of it has ended."""
    result = PhaseResult("fuzz-http")
    statuses: dict[int, int] = {}
    client = httpx.Client(base_url=target.url, timeout=give_up_s)

    def one(case: tuple[str, Any]) -> None:
        result.inputs += 1
        status = post_by(client, *case, deadline=time.monotonic() + give_up_s)
        statuses[status] = statuses.get(status, 0) + 1
        result.status_5xx += status >= 500
        if tick is not None:
            tick()
        if result.inputs % 500 == 0 and not target.alive():
            result.crashes += 1
            raise ServerDown

    try:
        _run_examples(_http_inputs(), n, rng_seed, one)
    except ServerDown:
        pass
    client.close()
    result.extra["statuses"] = {str(k): v for k, v in sorted(statuses.items())}
    return result


def post_by(client: httpx.Client, route: str, body: Any, deadline: float) -> int:
    """POST ``body`` and read the answer until ``deadline``: its status, -1 if we gave up
    on it (the server must then abort the request), -2 if the connection dropped. The
    deadline is on the whole answer: a client's per-read timeout never ends a stream whose
    tokens keep coming. A 5xx is its status even when not read to the end."""
    raw = body if isinstance(body, bytes) else dumps(body).encode()  # \ud800 too
    headers = {"content-type": "application/json"}
    try:
        with client.stream("POST", route, content=raw, headers=headers) as r:
            if r.status_code >= 500:
                return r.status_code
            for _ in r.iter_raw():
                if time.monotonic() > deadline:
                    return -1
            return r.status_code
    except httpx.TimeoutException:
        return -1
    except httpx.TransportError:
        return -2


def _ws_inputs() -> st.SearchStrategy[str | bytes]:
    events = [
        from_schema(_schema(model)).map(partial(_typed, kind=kind))
        for kind, model in CLIENT_EVENTS.items()
    ]
    garbage = st.one_of(
        st.text(max_size=100),
        st.binary(max_size=50),
        st.integers(100, 3000).map(lambda d: '{"type":' + "[" * d + "]" * d + "}"),
        nasty().map(dumps),
    )
    return st.one_of(*[e.map(dumps) for e in events], garbage)


def _typed(event: Any, kind: str) -> Any:
    if isinstance(event, dict):
        event["type"] = kind
    return event


def fuzz_ws(target: Target, n: int, rng_seed: int = 0) -> PhaseResult:
    """``n`` fuzzed Realtime events over a few sockets; every answer must be an event (a
    server_error one counts as a 5xx) and a socket may close only normally."""
    return settle(fuzz_ws_inputs(target, n, rng_seed), target)


def fuzz_ws_inputs(
    target: Target, n: int, rng_seed: int = 0, tick: Callable[[], None] | None = None
) -> PhaseResult:
    """``fuzz_ws``'s inputs alone, one socket at a time, ``tick`` called after each; the
    caller settles the phase (``settle``) once every client of it has ended."""
    result = PhaseResult("fuzz-ws")
    state: dict[str, Any] = {"ws": None, "closed_abnormally": 0, "events": 0}

    def socket_() -> Any:
        if state["ws"] is None:
            state["ws"] = ws_connect(f"{target.ws_url}/v1/realtime", max_size=None, open_timeout=30)
        return state["ws"]

    def drain(ws: Any, wait: float) -> None:
        while True:
            try:
                event = json.loads(ws.recv(timeout=wait))
            except TimeoutError:
                return
            state["events"] += 1
            if event.get("type") == "error" and event["error"].get("type") == "server_error":
                result.status_5xx += 1
            wait = 0.05

    def one(message: str | bytes) -> None:
        result.inputs += 1
        ws = socket_()
        try:
            ws.send(message)
            drain(ws, 0.3)
            if result.inputs % 50 == 0:  # a fresh socket now and then; end what runs
                ws.send(json.dumps({"type": "response.cancel"}))
                drain(ws, 0.3)
                ws.close()
                state["ws"] = None
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else 1006
            state["closed_abnormally"] += code not in (1000, 1001)
            state["ws"] = None
        if tick is not None:
            tick()

    _run_examples(_ws_inputs(), n, rng_seed, one)
    if state["ws"] is not None:
        state["ws"].close()
    result.extra.update(
        events_received=state["events"], sockets_closed_abnormally=state["closed_abnormally"]
    )
    return result


def _chat(text: str, max_tokens: int, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }


async def _stream_gaps(
    http: httpx.AsyncClient, body: dict[str, Any], stop_after: int | None = None
) -> tuple[int, list[float], float | None]:
    """POST a streaming chat; (status, gaps between content chunks, time to first chunk)."""
    start = time.perf_counter()
    last, gaps, ttft = None, [], None
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, [], None
        chunks = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            if '"content":"' not in line and '"content": "' not in line:
                continue
            if last is None:
                ttft = now - start
            else:
                gaps.append(now - last)
            last, chunks = now, chunks + 1
            if stop_after is not None and chunks >= stop_after:
                break  # the client walks away mid-stream
    return r.status_code, gaps, ttft


def abort_storm(target: Target, n: int, concurrency: int = 32, rng_seed: int = 0) -> PhaseResult:
    """``n`` streams, each cancelled at a random point (before its first byte, after a few
    chunks, or on a timer); then no KV block may stay in use."""
    result = PhaseResult("abort-storm")
    rng = random.Random(rng_seed)
    plans = [
        (
            rng.choice(["timer", "chunks", "chunks"]),
            rng.uniform(0.0, 1.5),
            rng.randint(0, 12),
            rng.randint(8, 64),
        )
        for _ in range(n)
    ]

    async def run() -> None:
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=target.url, timeout=120) as http:

            async def one(plan: tuple[str, float, int, int]) -> None:
                how, delay, chunks, max_tokens = plan
                body = _chat(
                    f"Tell me about the number {rng.randint(0, 999)}.", max_tokens, temperature=1.0
                )
                async with sem:
                    result.inputs += 1
                    try:
                        if how == "timer":
                            status, _, _ = await asyncio.wait_for(
                                _stream_gaps(http, body), timeout=delay
                            )
                        else:
                            status, _, _ = await _stream_gaps(http, body, stop_after=chunks)
                        result.status_5xx += status >= 500
                    except (TimeoutError, httpx.HTTPError):
                        pass

            await asyncio.gather(*(one(p) for p in plans))

    asyncio.run(run())
    result.crashes += not target.alive()
    result.leaked_blocks = target.wait_idle()
    return result


async def _itl_run(
    target: Target,
    clients: int,
    requests_each: int,
    max_tokens: int,
) -> dict[str, Any]:
    gaps: list[float] = []
    ttfts: list[float] = []
    statuses: dict[int, int] = {}
    retry_after_missing = 0
    async with httpx.AsyncClient(
        base_url=target.url, timeout=600, limits=httpx.Limits(max_connections=clients + 8)
    ) as http:

        async def client(i: int) -> None:
            nonlocal retry_after_missing
            for j in range(requests_each):
                body = _chat(
                    f"Write a story about client {i}, part {j}.",
                    max_tokens,
                    temperature=0.0,
                    ignore_eos=True,
                )
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    if r.status_code == 429:
                        retry_after_missing += "retry-after" not in r.headers
                        await r.aread()
                        await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                        continue
                    start, last = time.perf_counter(), None
                    async for line in r.aiter_lines():
                        if '"content":"' in line:
                            now = time.perf_counter()
                            if last is None:
                                ttfts.append(now - start)
                            else:
                                gaps.append(now - last)
                            last = now

        await asyncio.gather(*(client(i) for i in range(clients)))
    return {
        "gaps": gaps,
        "ttfts": ttfts,
        "statuses": statuses,
        "retry_after_missing": retry_after_missing,
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def overload(
    target: Target, max_num_seqs: int, max_waiting: int, max_tokens: int = 32, rounds: int = 3
) -> PhaseResult:
    """Unloaded: ``max_num_seqs`` streams at once (a full batch, nobody queued). Then 2x:
    twice the clients the server can hold (running + waiting), each sending ``rounds``
    requests: the excess must be answered 429 with Retry-After, and the admitted streams'
    inter-token gap is compared with the unloaded one."""
    result = PhaseResult("overload-2x")
    base = asyncio.run(_itl_run(target, max_num_seqs, 2, max_tokens))
    load = asyncio.run(_itl_run(target, 2 * (max_num_seqs + max_waiting), rounds, max_tokens))
    result.inputs = sum(load["statuses"].values())
    result.status_5xx = sum(v for k, v in load["statuses"].items() if k >= 500)
    p50 = (_pct(base["gaps"], 0.5), _pct(load["gaps"], 0.5))
    p90 = (_pct(base["gaps"], 0.9), _pct(load["gaps"], 0.9))
    result.extra = {
        "statuses": {str(k): v for k, v in sorted(load["statuses"].items())},
        "retry_after_missing": load["retry_after_missing"],
        "itl_ms_p50": [round(1000 * p50[0], 1), round(1000 * p50[1], 1)],  # unloaded, 2x
        "itl_ms_p90": [round(1000 * p90[0], 1), round(1000 * p90[1], 1)],
        "itl_ratio_p50": round(p50[1] / p50[0], 2),
        "itl_ratio_p90": round(p90[1] / p90[0], 2),
    }
    result.crashes += not target.alive()
    result.leaked_blocks = target.wait_idle()
    return result


def soak(
    target: Target,
    clients: int,
    seconds: float,
    sample_s: float = 5.0,
    warmup_frac: float = 0.25,
    rng_seed: int = 0,
) -> PhaseResult:
    """``clients`` loop a mix (streamed and whole chats, completions, early aborts) for
    ``seconds``; RSS and blocks are sampled every ``sample_s``. RSS growth is the last
    samples' mean over the RSS at the end of the warm-up (``warmup_frac`` of the run)."""
    result = PhaseResult("soak")
    rng = random.Random(rng_seed)
    samples: list[tuple[float, float, int]] = []
    deadline = time.monotonic() + seconds

    async def run() -> None:
        async with httpx.AsyncClient(
            base_url=target.url, timeout=120, limits=httpx.Limits(max_connections=clients + 8)
        ) as http:

            async def client(i: int) -> None:
                while time.monotonic() < deadline:
                    kind = rng.random()
                    result.inputs += 1
                    try:
                        if kind < 0.5:
                            stop = rng.randint(1, 8) if kind < 0.1 else None
                            status, _, _ = await _stream_gaps(
                                http,
                                _chat(
                                    f"Client {i}: say something.",
                                    rng.randint(4, 24),
                                    temperature=1.0,
                                ),
                                stop_after=stop,
                            )
                        elif kind < 0.8:
                            r = await http.post(
                                "/v1/chat/completions",
                                json=_chat(
                                    f"Client {i}: a fact?", rng.randint(4, 16), stream=False
                                ),
                            )
                            status = r.status_code
                        else:
                            r = await http.post(
                                "/v1/completions",
                                json={"prompt": f"{i} {rng.random()}", "max_tokens": 8},
                            )
                            status = r.status_code
                        result.status_5xx += status >= 500
                        if status == 429:
                            await asyncio.sleep(1.0)
                    except httpx.HTTPError:
                        pass

            async def sampler() -> None:
                while time.monotonic() < deadline:
                    samples.append(
                        (
                            time.monotonic(),
                            target.rss_mb(),
                            await asyncio.to_thread(target.blocks_used),
                        )
                    )
                    await asyncio.sleep(sample_s)

            await asyncio.gather(sampler(), *(client(i) for i in range(clients)))

    asyncio.run(run())
    result.crashes += not target.alive()
    result.leaked_blocks = target.wait_idle()
    samples.append((time.monotonic(), target.rss_mb(), result.leaked_blocks))
    warm = samples[max(1, int(len(samples) * warmup_frac))][1]
    tail = [s[1] for s in samples[-3:]]
    result.rss_growth_pct = round(100 * (statistics.mean(tail) - warm) / warm, 2)
    result.extra = {
        "rss_mb_after_warmup": round(warm, 1),
        "rss_mb_end": round(tail[-1], 1),
        "rss_mb_max": round(max(s[1] for s in samples), 1),
        "samples": len(samples),
        "blocks_max": max(s[2] for s in samples),
    }
    return result


def eviction(
    target: Target, prefixes: int = 4, suffixes: int = 6, concurrency: int = 12, rng_seed: int = 0
) -> PhaseResult:
    """Prompts sharing long prefixes, greedy: once one at a time (the reference), then all
    at once in a shuffled order on a KV pool too small to keep the prefixes cached, so
    blocks are evicted and requests preempted. Outputs must equal the reference."""
    result = PhaseResult("eviction")
    rng = random.Random(rng_seed)
    heads = [
        f"Document {p}: "
        + " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(60))
        for p in range(prefixes)
    ]
    prompts = [f"{h}\nQuestion {s}: what comes next?" for h in heads for s in range(suffixes)]

    def body(p: str) -> dict[str, Any]:
        return {"prompt": p, "max_tokens": 12, "temperature": 0}

    with httpx.Client(base_url=target.url, timeout=600) as http:
        reference = [
            http.post("/v1/completions", json=body(p)).json()["choices"][0]["text"] for p in prompts
        ]

    async def storm() -> list[str | None]:
        sem = asyncio.Semaphore(concurrency)
        order = list(range(len(prompts))) * 2
        rng.shuffle(order)
        out: list[str | None] = [None] * len(order)
        async with httpx.AsyncClient(base_url=target.url, timeout=600) as http:

            async def one(k: int, i: int) -> None:
                async with sem:
                    r = await http.post("/v1/completions", json=body(prompts[i]))
                    result.status_5xx += r.status_code >= 500
                    out[k] = r.json()["choices"][0]["text"] if r.status_code == 200 else None

            await asyncio.gather(*(one(k, i) for k, i in enumerate(order)))
        return [out[k] == reference[i] for k, i in enumerate(order)]  # type: ignore[misc]

    same = asyncio.run(storm())
    result.inputs = len(prompts) + len(same)
    result.extra = {"mismatches": len(same) - sum(bool(s) for s in same)}
    result.crashes += not target.alive()
    result.leaked_blocks = target.wait_idle()
    return result


def slow_clients(
    target: Target, partial: int = 50, readers: int = 8, health_probes: int = 20
) -> PhaseResult:
    """Connections that send half a header, and streams read slowly, while ``/health`` and a
    normal request are asked for: both must still be answered."""
    result = PhaseResult("slow-clients")
    host, port = target.url.removeprefix("http://").split(":")
    socks = []
    for _ in range(partial):
        s = socket.create_connection((host, int(port)), timeout=60)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    result.inputs = partial + readers

    async def slow_reader(http: httpx.AsyncClient, i: int) -> None:
        async with http.stream(
            "POST", "/v1/chat/completions", json=_chat(f"Reader {i}: count to twenty.", 24)
        ) as r:
            result.status_5xx += r.status_code >= 500
            async for _ in r.aiter_raw(16):
                await asyncio.sleep(0.2)

    async def run() -> list[float]:
        async with httpx.AsyncClient(base_url=target.url, timeout=120) as http:
            tasks = [asyncio.create_task(slow_reader(http, i)) for i in range(readers)]
            latencies = []
            for _ in range(health_probes):
                t = time.perf_counter()
                r = await http.get("/health")
                latencies.append(time.perf_counter() - t)
                result.status_5xx += r.status_code >= 500
                await asyncio.sleep(0.2)
            ok = await http.post("/v1/chat/completions", json=_chat("Hi", 4, stream=False))
            result.status_5xx += ok.status_code >= 500
            await asyncio.gather(*tasks, return_exceptions=True)
            return latencies

    latencies = asyncio.run(run())
    closed = 0
    for s in socks:
        s.settimeout(0.1)
        try:
            closed += s.recv(64).startswith(b"HTTP/1.1 408") or False
        except OSError:
            pass
        s.close()
    result.extra = {
        "health_max_ms": round(1000 * max(latencies), 1),
        "partial_connections_closed_408": closed,
    }
    result.crashes += not target.alive()
    result.leaked_blocks = target.wait_idle()
    return result


def long_prefill(target: Target, words: int = 1500) -> PhaseResult:
    """The issue's case: a stream decoding, a ``words``-word prompt sent, then a short chat
    2 s later. Reports the short chat's time to first token (and unloaded), and the
    running stream's largest gap while the long prompt prefilled."""
    result = PhaseResult("long-prefill")
    text = " ".join(
        (
            "the quick brown fox jumps over a lazy dog while seven ravens watch "
            * (words // 13 + 1)
        ).split()[:words]
    )

    async def run() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=target.url, timeout=600) as http:
            _, _, unloaded = await _stream_gaps(http, _chat("What is the capital of France?", 8))
            stream = asyncio.create_task(
                _stream_gaps(http, _chat("Count from one to one hundred.", 200, ignore_eos=True))
            )
            await asyncio.sleep(1.0)
            long = asyncio.create_task(_stream_gaps(http, _chat(text, 1)))
            await asyncio.sleep(2.0)
            _, _, short_ttft = await _stream_gaps(http, _chat("What is the capital of France?", 8))
            _, gaps, _ = await stream
            _, _, long_ttft = await long
            return {
                "short_ttft_unloaded_s": round(unloaded or 0, 2),
                "short_ttft_behind_long_s": round(short_ttft or 0, 2),
                "long_ttft_s": round(long_ttft or 0, 2),
                "stream_max_gap_s": round(max(gaps), 2) if gaps else None,
                "stream_median_gap_s": round(statistics.median(gaps), 3) if gaps else None,
            }

    result.inputs = 4
    result.extra = asyncio.run(run())
    result.crashes += not target.alive()
    result.leaked_blocks = target.wait_idle()
    return result
