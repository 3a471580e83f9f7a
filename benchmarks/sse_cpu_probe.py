"""API-server CPU time per SSE event of ``mmserve serve --engine-process --api-server-count 1``.

Each checkout given starts its own server (``PYTHONPATH`` = the checkout, the real split
front end, ``--device cpu`` by default); all stay up, and the loads alternate between them
in rounds (the machine drifts). A load is ``--clients`` openai-SDK clients, each sending
``--requests`` streamed chat requests one after another (greedy, ``ignore_eos``,
``--max-tokens``, usage chunk on). The figure is the API server's on-CPU time over the
load (every thread, from ``/proc/PID/task/*/schedstat``: nanoseconds, not clock ticks),
less its idle rate measured over ``--idle-s`` right before (uvicorn's ticks, the core
probes), over the SSE events the clients received (every chunk and ``[DONE]``).

``--layers N`` serves the default model cut to its first N layers (same tokenizer, so
the same detokenization and chunks): the full model steps so slowly on a small CPU that
the idle rate would swamp the figure.

Usage: python benchmarks/sse_cpu_probe.py CHECKOUT [CHECKOUT ...] [--rounds 3]
       [--clients 32] [--requests 3] [--max-tokens 64] [--layers 2] [--serve-arg=--flag ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ADDRESS = re.compile(r"on http://([\d.]+):(\d+)")


def cpu_s(pid: int) -> float:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass  # a thread that ended meanwhile
    return total / 1e9


async def _client(client, model: str, max_tokens: int, requests: int) -> int:
    events = 0
    for r in range(requests):
        stream = await client.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": "You are a storyteller. Answer at length."},
                {"role": "user", "content": f"Story {r}: tell me a long story about a robot."},
            ],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for _ in stream:
            events += 1
        events += 1  # data: [DONE], which the SDK does not yield
    return events


async def load(base_url: str, clients: int, requests: int, max_tokens: int) -> int:
    """Run one load; the number of SSE events received."""
    import httpx
    from openai import AsyncOpenAI

    limits = httpx.Limits(max_connections=clients + 8)
    client = AsyncOpenAI(
        base_url=base_url, api_key="x", max_retries=0, http_client=httpx.AsyncClient(limits=limits)
    )
    model = (await client.models.list()).data[0].id
    counts = await asyncio.gather(
        *(_client(client, model, max_tokens, requests) for _ in range(clients))
    )
    await client.close()
    return sum(counts)


def cut_model(layers: int, out: Path) -> Path:
    """The default model's first ``layers`` layers, written as a model directory."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from mmserve.models import hub

    src = hub.resolve_model(None)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config))
    weights = load_file(src / "model.safetensors")
    kept = {
        k: v
        for k, v in weights.items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
    }
    save_file(kept, out / "model.safetensors")
    return out


def start(checkout: str, serve_args: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [
        *(sys.executable, "-m", "mmserve.cli", "serve", "--device", "cpu", "--port", "0"),
        *("--engine-process", "--api-server-count", "1", *serve_args),
    ]
    env = dict(os.environ, PYTHONPATH=checkout)
    proc = subprocess.Popen(
        cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    for line in proc.stdout:  # type: ignore[union-attr]
        if m := ADDRESS.search(line):
            return proc, f"http://{m.group(1)}:{m.group(2)}/v1"
    raise RuntimeError(f"{checkout}: the server did not start")


def measure(proc: subprocess.Popen, url: str, args: argparse.Namespace) -> float:
    """One load on one server: idle-corrected API-server CPU us per SSE event."""
    before = cpu_s(proc.pid)
    time.sleep(args.idle_s)
    idle = (cpu_s(proc.pid) - before) / args.idle_s
    t0, c0 = time.monotonic(), cpu_s(proc.pid)
    events = asyncio.run(load(url, args.clients, args.requests, args.max_tokens))
    wall, used = time.monotonic() - t0, cpu_s(proc.pid) - c0
    us = (used - idle * wall) / events * 1e6
    print(
        f"  {events} events, {wall:.1f} s, CPU {used:.2f} s, idle {idle * 1e3:.1f} ms/s "
        f"-> {us:.1f} us/event",
        flush=True,
    )
    return us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkouts", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--idle-s", type=float, default=6.0)
    ap.add_argument("--layers", type=int, default=0, help="cut the default model (0: whole)")
    ap.add_argument("--serve-arg", action="append", default=[], help="one more serve flag")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.layers:
            args.serve_arg.append(f"--model={cut_model(args.layers, Path(tmp))}")
        run(args)


def run(args: argparse.Namespace) -> None:
    servers = [start(c, args.serve_arg) for c in args.checkouts]
    figures: dict[str, list[float]] = {c: [] for c in args.checkouts}
    try:
        for _, url in servers:
            asyncio.run(load(url, args.clients, 1, args.max_tokens))  # warm-up
        for rnd in range(args.rounds):
            order = list(zip(args.checkouts, servers, strict=True))
            for checkout, (proc, url) in order[:: -1 if rnd % 2 else 1]:
                print(f"round {rnd} {checkout}", flush=True)
                figures[checkout].append(measure(proc, url, args))
        for checkout, values in figures.items():
            runs = ", ".join(f"{v:.0f}" for v in values)
            print(f"{checkout}: median {statistics.median(values):.1f} us/event ({runs})")
    finally:
        for proc, _ in servers:
            proc.terminate()
        for proc, _ in servers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
