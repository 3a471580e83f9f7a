"""Host CPU time per streamed token on the serving path, without a model (CPU is enough).

A stand-in engine (``PacedEngine``) gives every running request one token a step, one
step every ``--step-ms`` (a GPU's decode step), on ``AsyncEngine``'s real engine thread;
``N`` consumers on the event loop read ``AsyncEngine.generate`` and turn the deltas into
SSE events with the real ``stream_chat`` and ``sse_event`` (the chat route's work
after the engine, less the socket). The figure is the process's CPU time (both threads)
over the tokens delivered: the host's price of one streamed token, and the tok/s the
path sustained. Tokens are counted from the deltas, so coalesced ones count too.

Usage: PYTHONPATH=$PWD python benchmarks/serve_host_cost.py [--streams 16,256]
       [--tokens 64] [--step-ms 2] [--out FILE.json]
Run it against two checkouts (PYTHONPATH) for a before/after on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

from mmserve.engine.async_engine import AsyncEngine
from mmserve.engine.outputs import EngineStats, RequestOutput
from mmserve.server.chat_output import ChatContext, ParserSettings, stream_chat
from mmserve.server.sse import sse_event


class PacedEngine:
    """What ``AsyncEngine`` needs of an ``LLMEngine``: requests decode one token a step,
    a step every ``step_s`` seconds, each token the text " tok"."""

    def __init__(self, step_s: float) -> None:
        self.step_s, self.next_at = step_s, 0.0
        self.tokenizer = SimpleNamespace(encode=lambda t: [1, 2, 3])
        self.max_model_len = 1 << 20
        self.config = SimpleNamespace(max_waiting=1 << 20)
        self.connector = None
        self.scheduler = SimpleNamespace(waiting=[])
        self.requests: dict[str, tuple[Any, list[int]]] = {}

    def _validate(self, *args: Any) -> None:
        pass

    def add_request(self, prompt: list[int], params: Any, rid: str, *rest: Any) -> str:
        self.requests[rid] = (params, [])
        return rid

    def abort(self, rid: str) -> None:
        self.requests.pop(rid, None)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def idle_for(self) -> float:
        return 0.0

    def step(self) -> list[RequestOutput]:
        wait = self.next_at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        self.next_at = time.perf_counter() + self.step_s
        outs = []
        for rid, (params, ids) in list(self.requests.items()):
            ids.append(len(ids))
            done = len(ids) >= params.max_tokens
            outs.append(
                RequestOutput(
                    rid,
                    [ids[-1]],
                    " tok",
                    list(ids),
                    " tok" * len(ids),
                    done,
                    "length" if done else None,
                    3,
                )
            )
            if done:
                del self.requests[rid]
        return outs

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0, len(self.requests), 0, 0, 0, 0, 0, 0)


async def _consume(engine: AsyncEngine, i: int, max_tokens: int) -> tuple[int, int]:
    from mmserve.sampling_params import SamplingParams

    ctx = ChatContext(
        request_id=f"chatcmpl-{i}",
        model="m",
        num_prompt_tokens=3,
        n=1,
        parser_settings=ParserSettings(),
        include_usage=True,
    )
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    tokens = events = 0

    async def outputs():
        nonlocal tokens
        async for out in engine.generate([1, 2, 3], params, f"r{i}"):
            tokens += len(out.new_token_ids)
            yield 0, out

    async for chunk in stream_chat(ctx, outputs()):
        sse_event(chunk)
        events += 1
    return tokens, events


def run(streams: int, tokens: int, step_s: float) -> dict[str, Any]:
    async def go() -> list[tuple[int, int]]:
        engine = AsyncEngine(PacedEngine(step_s), "paced")  # type: ignore[arg-type]
        try:
            return await asyncio.gather(*(_consume(engine, i, tokens) for i in range(streams)))
        finally:
            await engine.shutdown()

    cpu, wall = time.process_time(), time.perf_counter()
    results = asyncio.run(go())
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    total = sum(t for t, _ in results)
    return {
        "streams": streams,
        "tokens": total,
        "events": sum(e for _, e in results),
        "wall_s": round(wall, 3),
        "tok_s": round(total / wall),
        "offered_tok_s": round(streams / step_s),
        "host_us_per_token": round(cpu / total * 1e6, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="16,256")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for n in (int(s) for s in args.streams.split(",")):
        runs = [run(n, args.tokens, args.step_ms / 1000) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["host_us_per_token"])  # least disturbed by others
        rows.append(best)
        print(
            f"{n:>5} streams: {best['host_us_per_token']:>7.2f} us/token host, "
            f"{best['tok_s']:>8,} tok/s of {best['offered_tok_s']:,} offered, "
            f"{best['events'] / best['tokens']:.2f} events/token",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"step_ms": args.step_ms, "tokens": args.tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
