"""``mmserve bench serve``: the live server against the engine in-process, in one run.

1. ``mmserve serve`` starts as a child process (the real model, its own defaults plus
   ``serve_args``: pass e.g. the flags of another process layout to compare), its output
   kept in ``server.log``; the start-up time is from launch to its address.
2. ``first_burst``: the fresh server's first ``burst`` requests, all sent at once.
3. For each protocol (``sse``: the openai SDK streaming; ``ws``: the Realtime WebSocket)
   and each concurrency ``c``: ``c`` clients in a closed loop (``serve_clients``), every
   request greedy with ``ignore_eos`` and ``max_tokens`` new tokens, so every request
   costs the same; tok/s, TTFT p50/p99, gap p50/p99.
4. ``steady_burst``: a burst of the same size and shape on the now warm server, of
   prompts it has not seen (the same prompts again would find their prefixes cached,
   which a fresh server's first requests cannot); the first burst's TTFT over this one's
   says what start-up left to the first requests.
5. The server stops; the same engine configuration (the same flags, parsed by the CLI)
   runs in this process with the same prompts, ``c`` requests in flight in a closed loop
   over ``LLM``'s engine: the baseline each served load is a fraction of.

Writes ``serve.json`` (+ ``serve.png`` when matplotlib is there) to ``out_dir``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mmserve import envs
from mmserve.bench import proc_cpu, serve_clients, serve_report
from mmserve.bench.serve_clients import Load, Messages, Timing, run_load

SYSTEM = "You are a storyteller. Answer at length."
TOPICS = (
    "a lighthouse keeper",
    "a lost robot",
    "the first city on Mars",
    "a dragon who bakes",
    "a river that flows uphill",
    "two rival chess clubs",
    "a library of sounds",
    "an island of clocks",
)


def prompts(n: int = 64) -> list[Messages]:
    """``n`` distinct chat requests of about the same length (~45 tokens templated)."""
    return [
        [
            {"role": "system", "content": SYSTEM},
            {
                "role": "user",
                "content": f"Story {i}: tell me a long story about "
                f"{TOPICS[i % len(TOPICS)]}, part {i // len(TOPICS)}.",
            },
        ]
        for i in range(n)
    ]


@dataclass
class ServeBenchConfig:
    model: str | None = None  # None: the default model
    device: str = "auto"
    concurrency: tuple[int, ...] = (1, 16, 64, 256)
    max_tokens: int = 256
    requests_per_client: int = 2  # a load sends max(c * this, min_requests) requests
    min_requests: int = 8
    burst: int = 32  # first_burst / steady_burst size (0: skip both)
    protocols: tuple[str, ...] = ("sse", "ws")
    engine: bool = True  # the in-process baseline
    client_procs: int = 0  # client processes (0: auto, the cores the server leaves, 1..16)
    serve_args: tuple[str, ...] = ()
    out_dir: str = "bench/out"
    startup_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("concurrency must be one or more integers >= 1")
        if min(self.max_tokens, self.requests_per_client, self.min_requests) < 1 or self.burst < 0:
            raise ValueError(
                "max_tokens, requests_per_client and min_requests must be >= 1, burst >= 0"
            )
        for p in self.protocols:
            if p not in ("sse", "ws"):
                raise ValueError(f"protocol {p!r}: use sse and/or ws")

    def procs(self) -> int:
        """Client processes: as set, else every core the served layout leaves
        (``ServerConfig.resolve_layout``: its engine core takes one, its API servers
        half a core each, what they drew under SSE at 256 clients on an H100: 0.3-0.5),
        1 to 16. An SDK client spends ~200 us of CPU an event on these hosts: at the
        engine's rates eight of them ran at 0.8 of a core each and held the load back
        (the server's own counters showed it: a lower batch at 256 clients), and
        eleven still held SSE's gap p99 at 256 clients to 53-81 ms, against 35-40 ms
        with thirteen and 27-33 ms with fourteen."""
        if self.client_procs:
            return self.client_procs
        from mmserve.config import ServerConfig

        cpus = os.cpu_count() or 1
        cuda = self.device.startswith("cuda")
        if self.device == "auto":
            import torch

            cuda = torch.cuda.is_available()
        layout = ServerConfig().resolve_layout(cuda, cpus)
        api = layout.api_server_count or 1
        server = bool(layout.engine_process) + (-(-api // 2) if layout.engine_process else api)
        return max(1, min(16, cpus - server))

    def serve_flags(self) -> list[str]:
        """Flags for ``mmserve serve``: the bench's, then ``serve_args`` (later flags win).
        The queue bound holds every load's clients, so no request is refused with a 429."""
        flags = [
            "--device",
            self.device,
            "--voice",
            "none",
            "--max-waiting",
            str(max(256, 2 * max(self.concurrency, default=1), 2 * self.burst)),
        ]
        if self.model:
            flags += ["--model", self.model]
        return flags + list(self.serve_args)


def run_serve_bench(
    cfg: ServeBenchConfig, engine_config: Callable[[list[str]], Any]
) -> dict[str, Any]:
    """``engine_config(serve_flags)``: the EngineConfig that ``mmserve serve`` builds from
    those flags (the CLI's own parser, passed in so this module never imports the CLI),
    so the in-process baseline runs the served configuration. Runs every phase, prints the
    table, writes JSON (+ PNG) under ``out_dir``."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"config": asdict(cfg), "machine": machine(cfg.device)}
    pool: Executor | None = None
    if cfg.procs() > 1:  # started (and its clients imported) before the server starts
        pool = ProcessPoolExecutor(cfg.procs(), mp_context=_spawn())
        list(pool.map(_ready, range(cfg.procs())))
    try:
        result.update(serve_phases(cfg, pool, out))
    finally:
        if pool is not None:
            pool.shutdown()
    if cfg.engine:
        result["engine"] = engine_phase(cfg, engine_config(cfg.serve_flags()))
    serve_report.ratios(result)
    print(serve_report.table(result))
    result["plot"] = serve_report.plot(result, out / "serve.png")
    (out / "serve.json").write_text(json.dumps(result, indent=1, default=str))
    if not result["plot"].endswith(".png"):
        print(
            f"{result['plot']}: plot elsewhere with python -m mmserve.bench.serve_report "
            f"{out / 'serve.json'}",
            flush=True,
        )
    return result


def serve_phases(cfg: ServeBenchConfig, pool: Executor | None, out: Path) -> dict[str, Any]:
    from mmserve.bench.stress.target import spawn

    started = time.monotonic()
    target = spawn(cfg.serve_flags(), cfg.startup_s, str(out / "server.log"), "info")
    res: dict[str, Any] = {
        "server": {
            "startup_s": round(time.monotonic() - started, 2),
            "flags": cfg.serve_flags(),
            "log": str(out / "server.log"),
        }
    }
    try:
        model = _served_model(target.url)
        res["model"] = model
        sets = prompts()

        def level(
            kind: str, clients: int, requests: int, name: str = "", asked: list | None = None
        ) -> dict:
            asked = sets if asked is None else asked
            load = Load(target.url, model, kind, clients, requests, asked, cfg.max_tokens)
            counters = _served_counters(target.url)
            before, wall = proc_cpu.snapshot(target.pid), time.monotonic()
            shares = run_load(load, pool, cfg.procs())
            use = proc_cpu.usage(before, proc_cpu.snapshot(target.pid), time.monotonic() - wall)
            timings = [t for s in shares for t in s.timings]
            lv = serve_report.summarize(timings, clients, shares)
            lv["server_cpu"] = use
            lv["counters"] = counters_delta(counters, _served_counters(target.url))
            busiest = proc_cpu.busiest_thread(use)
            steps = lv["counters"]
            print(
                f"[{name or kind}] {clients} clients: {lv['tok_s']} tok/s, TTFT p99 "
                f"{lv['ttft_p99_ms']} ms, gap p99 {lv['gap_p99_ms']} ms, "
                f"{lv['errors']} errors; steps {steps.get('engine_steps')} (batch "
                f"{steps.get('mean_batch')}, ahead {steps.get('ahead_share')}, prompt "
                f"{steps.get('engine_prompt_steps')}); server CPU "
                + ", ".join(f"{p} {u['cpu']:.2f}" for p, u in use.items())
                + (f"; busiest thread {busiest[0]} {busiest[1]:.2f}" if busiest else ""),
                flush=True,
            )
            return lv

        if cfg.burst:
            res["first_burst"] = level("sse", cfg.burst, cfg.burst, "first_burst")
        for kind in cfg.protocols:
            res[kind] = {str(c): level(kind, c, _requests(cfg, c)) for c in cfg.concurrency}
        if cfg.burst:  # prompts no load sent, so none finds its prefix cached
            unseen = prompts(len(sets) + cfg.burst)[len(sets) :]
            res["steady_burst"] = level("sse", cfg.burst, cfg.burst, "steady_burst", unseen)
        res["server"]["alive_after"] = target.alive()
    finally:
        target.stop()
    res["server"]["startup_lines"] = _startup_lines(out / "server.log")
    return res


def engine_phase(cfg: ServeBenchConfig, engine_cfg: Any) -> dict[str, Any]:
    """Each concurrency on the same engine configuration, in this process."""
    from mmserve.llm import LLM
    from mmserve.sampling_params import SamplingParams

    llm = LLM(**asdict(engine_cfg))
    tok = llm.tokenizer
    ids = [
        tok.encode(tok.apply_chat_template(m, add_generation_prompt=True), add_special_tokens=False)
        for m in prompts()
    ]
    params = SamplingParams(temperature=0, max_tokens=cfg.max_tokens, ignore_eos=True)
    top = max(cfg.concurrency)
    closed_loop(
        llm.engine, ids, top, top, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )  # warm
    levels = {}
    for c in cfg.concurrency:
        before = engine_counters(llm.engine)
        timings = closed_loop(llm.engine, ids, c, _requests(cfg, c), params)
        levels[str(c)] = serve_report.summarize(timings, c)
        levels[str(c)]["counters"] = counters_delta(before, engine_counters(llm.engine))
        print(
            f"[engine] {c} in flight: {levels[str(c)]['tok_s']} tok/s; "
            f"{levels[str(c)]['counters']}",
            flush=True,
        )
    return levels


# the engine's counters a load's figures are read beside: what speculation did (it
# decides per step whether to draft) and how the step loop ran (steps, their mean batch,
# how many carried a prompt chunk or went out ahead of the last step's tokens)
COUNTERS = {  # the name under /metrics (less ``mmserve_``, ``_total``) -> EngineStats field
    "spec_draft_tokens": "spec_draft_tokens_total",
    "spec_accepted_tokens": "spec_accepted_tokens_total",
    "engine_steps": "steps_total",
    "engine_step_seqs": "step_seqs_total",
    "engine_prompt_steps": "prompt_steps_total",
    "engine_steps_ahead": "steps_ahead_total",
    "engine_steps_prelaunched": "steps_prelaunched_total",
    "engine_ahead_admissions": "ahead_admissions_total",
}


def engine_counters(engine: Any) -> dict[str, float]:
    """``COUNTERS`` of an in-process ``LLMEngine``, as ``/metrics`` names them."""
    st = engine.stats()
    return {name: getattr(st, field) for name, field in COUNTERS.items()}


def counters_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The counters over a load, with the step loop's mean batch and the share of steps
    launched ahead (absent counters: nothing to report)."""
    d = {k: v - before.get(k, 0) for k, v in after.items()}
    steps = d.get("engine_steps", 0)
    if steps:
        d["mean_batch"] = round(d.get("engine_step_seqs", 0) / steps, 1)
        d["ahead_share"] = round(d.get("engine_steps_ahead", 0) / steps, 3)
    return d


def closed_loop(
    engine: Any, prompt_ids: list[list[int]], clients: int, requests: int, params: Any
) -> list[Timing]:
    """``requests`` requests through ``engine`` (an ``LLMEngine``), ``clients`` in flight:
    each one that finishes is replaced by the next, as the served clients do."""
    active: dict[str, tuple[Timing, list[float]]] = {}
    done: list[Timing] = []
    sent = 0

    def add() -> None:
        nonlocal sent
        t = Timing(time.monotonic())
        active[engine.add_request(prompt_ids[sent % len(prompt_ids)], params)] = (t, [])
        sent += 1

    while sent < min(clients, requests):
        add()
    while active:
        for o in engine.step():
            if o.request_id not in active:
                continue
            t, last = active[o.request_id]
            now = time.monotonic()
            if o.new_token_ids:
                if t.ttft is None:
                    t.ttft = now - t.start
                else:
                    t.gaps.append(now - last[0])
                last[:] = [now]
            if o.finished:
                t.end, t.tokens = now, len(o.token_ids)
                done.append(t)
                del active[o.request_id]
                if sent < requests:
                    add()
    return done


def machine(device: str) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available() and device != "cpu"
    name = torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores)"
    return {
        "device": name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def _requests(cfg: ServeBenchConfig, clients: int) -> int:
    return max(clients * cfg.requests_per_client, cfg.min_requests)


def _auth() -> dict[str, str]:
    """The served API key's header, if the server was started with one."""
    key = envs.MMSERVE_API_KEY
    return {"Authorization": f"Bearer {key}"} if key else {}


def _served_model(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/models", headers=_auth(), timeout=60).json()["data"][0]["id"]


def _served_counters(url: str) -> dict[str, float]:
    """The served engine's ``COUNTERS`` from ``/metrics``; empty if they cannot be read."""
    import httpx

    try:
        return parse_counters(httpx.get(f"{url}/metrics", headers=_auth(), timeout=30).text)
    except httpx.HTTPError:
        return {}


def parse_counters(text: str) -> dict[str, float]:
    """``COUNTERS`` from Prometheus text (each summed over its labels: every engine)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("mmserve_"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0].removeprefix("mmserve_")
        name = name.removesuffix("_total")
        if name in COUNTERS:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _startup_lines(log: Path) -> list[str]:
    """The server's start-up log lines (loading, graph capture, warm-up, ready)."""
    words = ("loaded", "captured", "warm", "ready", "start-up", "serving", "defaults")
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if any(w in ln for w in words)][:40]


def _spawn():
    import multiprocessing

    return multiprocessing.get_context("spawn")


def _ready(_: int) -> bool:
    import websockets  # noqa: F401 - the client process pays its imports before any load

    serve_clients.warm_client()  # and the SDK's first request, against a canned answer
    return True
