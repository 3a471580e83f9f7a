"""``mmserve serve`` as processes: one engine core, one or more API servers on one port.

The launcher spawns the engine core (``mmserve.engine.core_process``) and waits until it
has loaded; binds the port; spawns ``api_server_count - 1`` API-server processes, each
listening on a socket of its own bound to that port (or, where the kernel does not
balance such sockets, accepting on the launcher's, handed to them at spawn); waits until
they all listen; and serves as the first API server itself. Each API server loads only
the CPU halves (tokenizer, chat template, image processor, the voice's phonemizer) and
talks to the core through ``core_client.RemoteEngine``. With more than one API server,
their metrics sum in a temporary directory (``metrics.ServerMetrics``) removed at exit. A
thread reaps children as they
exit, so a dead core is seen as dead (not a zombie) by every API server, which then
answers ``/health`` with 503 and ends in-flight requests with an error. SIGTERM/SIGINT
stop the API servers, then the core.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from mmserve.config import EngineConfig, ServerConfig, SpeechConfig
from mmserve.engine import wire
from mmserve.engine.core_process import CoreAddress, start_core, wait_ready
from mmserve.procname import name_this_thread
from mmserve.server.core_client import Core, RemoteEngine
from mmserve.server.launch import exit_on_signal, raise_fd_limit, serve_app, setup_logging

log = logging.getLogger("mmserve")

# Linux spreads a port's connections over the sockets bound to it with SO_REUSEPORT by a
# hash of each connection's addresses, whoever is busy. On one shared socket, every API
# server wakes for a new connection and the first to run accepts all that are queued: a
# burst of 64 connections went 63/1 over 4 servers on a 2-core host (the busiest took
# 20-24 of them with SO_REUSEPORT). Elsewhere (BSD and macOS do not balance) they share one socket.
REUSEPORT_BALANCES = sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")


def run_split(
    engine_config: EngineConfig, server_config: ServerConfig, speech_config: SpeechConfig
) -> int:
    address = CoreAddress.fresh()
    name_this_thread("mmserve-api-0")
    core = start_core(engine_config, speech_config, address, server_config.log_level)
    children: list[BaseProcess] = []
    signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        try:
            info = wait_ready(address, core)
        except RuntimeError as exc:
            print(f"mmserve: error: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"mmserve: engine core running in process {info.pid}", flush=True)
        count = server_config.api_server_count or 1  # resolved by ``run_server``
        balanced = count > 1 and REUSEPORT_BALANCES
        try:
            sock = listen(server_config, reuse_port=balanced)
        except OSError as exc:
            where = f"{server_config.host}:{server_config.port}"
            print(f"mmserve: error: cannot listen on {where}: {exc.strerror}", file=sys.stderr)
            return 1
        port = sock.getsockname()[1]
        metrics_dir: str | None = None
        if count > 1:
            metrics_dir = tempfile.mkdtemp(prefix="mmserve-metrics-")
            atexit.register(shutil.rmtree, metrics_dir, ignore_errors=True)
        ctx = multiprocessing.get_context("spawn")
        ready = [ctx.Event() for _ in range(1, count)]
        for i, accepting in enumerate(ready, start=1):
            child = ctx.Process(
                target=api_server_main,
                name=f"mmserve-api-{i}",
                args=(
                    address,
                    info,
                    server_config,
                    speech_config,
                    None if balanced else sock,
                    port,
                    accepting,
                    os.getpid(),
                    metrics_dir,
                ),
            )
            child.start()
            children.append(child)
        threading.Thread(
            target=_reap, args=([core, *children],), name="mmserve-reaper", daemon=True
        ).start()
        if not _all_listening(children, ready):
            print("mmserve: error: an API server exited while starting", file=sys.stderr)
            return 1
        engine, speech = remote_engines(address, info, speech_config, announce=True)
        try:
            asyncio.run(
                serve_app(
                    engine,
                    server_config,
                    speech=speech,
                    sockets=[sock],
                    max_speech_input_chars=speech_config.max_speech_input_chars,
                    metrics_dir=metrics_dir,
                )
            )
        except KeyboardInterrupt:
            pass
        finally:
            engine.shutdown_sync()
    finally:
        _stop([*children, core])
    return 0


def listen(config: ServerConfig, reuse_port: bool = False, join: bool = False) -> socket.socket:
    """The launcher's listening socket, bound before any API server starts (so
    ``--port 0`` names one port for all of them). ``reuse_port``: each API server binds
    a socket of its own to the same port (``REUSEPORT_BALANCES``; ``join``: an API
    server joining the launcher's); otherwise they all accept on this one."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    if reuse_port and not join and config.port:
        # SO_REUSEPORT would let this bind join another server's group on a port it
        # already serves (same user) and silently take a share of its connections: a
        # plain bind first refuses the port as a second server without it would be
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((config.host, config.port))
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((config.host, config.port))
    sock.listen(2048)
    sock.set_inheritable(not reuse_port)
    return sock


def _all_listening(children: list[BaseProcess], ready: list[Any], timeout: float = 600.0) -> bool:
    """Wait until every API server listens (so no connection is hashed to a socket that
    is not there yet); False if one exits first."""
    deadline = time.monotonic() + timeout
    for child, accepting in zip(children, ready, strict=True):
        while not accepting.wait(0.2):
            if not child.is_alive() or time.monotonic() > deadline:
                return False
    return True


def api_server_main(
    address: CoreAddress,
    info: wire.CoreInfo,
    server_config: ServerConfig,
    speech_config: SpeechConfig,
    sock: socket.socket | None,
    port: int,
    accepting: Any,
    launcher_pid: int,
    metrics_dir: str | None,
) -> None:
    """One more API server (a spawned child): serve on the launcher's socket, or on one of
    its own bound to the same port (``sock`` None), until signalled or until the launcher
    is gone (an orphan would keep answering 503 forever). ``accepting`` is set once it
    listens; its metrics sum with the others' in ``metrics_dir``."""
    setup_logging(server_config)
    raise_fd_limit()
    name_this_thread(multiprocessing.current_process().name)
    threading.Thread(
        target=_stop_when_orphaned, args=(launcher_pid,), name="mmserve-parent", daemon=True
    ).start()
    engine, speech = remote_engines(address, info, speech_config, announce=False)
    if sock is None:
        sock = listen(dataclasses.replace(server_config, port=port), reuse_port=True, join=True)
    accepting.set()
    try:
        asyncio.run(
            serve_app(
                engine,
                server_config,
                out=None,
                speech=speech,
                sockets=[sock],
                max_speech_input_chars=speech_config.max_speech_input_chars,
                metrics_dir=metrics_dir,
            )
        )
    except KeyboardInterrupt:
        pass
    finally:
        engine.shutdown_sync()


def remote_engines(
    address: CoreAddress, info: wire.CoreInfo, speech_config: SpeechConfig, announce: bool
) -> tuple[RemoteEngine, Any]:
    """The LLM (tokenizer and image processor loaded here) and, if the core runs a voice,
    a ``SpeechService`` whose engine is the core's voice."""
    from mmserve.models.tokenizer import Tokenizer

    tokenizer = Tokenizer(Path(info.model_path))
    processor = None
    if info.connector_path is not None:
        from connectors.loader import load_processor

        processor = load_processor(Path(info.connector_path), tokenizer)
    core = Core(address, info)
    engine = RemoteEngine(core, wire.LLM, tokenizer, processor)
    speech = None
    if len(info.members) > wire.VOICE:
        from tts.registry import load
        from tts.service import SpeechService

        speech = SpeechService(
            load(speech_config.voice, speech_config.snac), RemoteEngine(core, wire.VOICE, None)
        )
    elif speech_config.enabled and announce:
        print(
            "mmserve: no default voice (build it with `mmserve voice train`); "
            "/v1/audio/speech is off",
            flush=True,
        )
    return engine, speech


def spawn_engine(engine_config: EngineConfig, log_level: str = "warning") -> RemoteEngine:
    """An engine core in a process of its own, and the LLM's ``RemoteEngine`` in this one
    (tests, scripts). ``shutdown_sync()`` stops the core, and so does this process's exit
    (a core left running would hold the interpreter's exit forever)."""
    address = CoreAddress.fresh()
    proc = start_core(engine_config, None, address, log_level)
    atexit.register(_stop, [proc])
    try:
        info = wait_ready(address, proc)
        engine, _ = remote_engines(address, info, SpeechConfig(voice="none"), announce=False)
    except BaseException:
        _stop([proc])
        raise
    engine.core.on_close = lambda: _stop([proc])
    engine.core.process = proc
    return engine


def _stop_when_orphaned(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's handler: a graceful stop


def _reap(procs: list[BaseProcess]) -> None:
    """Join children as they exit (a reaped core's pid is gone: API servers see it dead)."""
    live = {p.sentinel: p for p in procs}
    while live:
        for sentinel in wait(list(live)):
            proc = live.pop(sentinel)  # type: ignore[arg-type,call-overload]
            proc.join()
            # None: ``_stop`` (shutting down) reaped it first, from its own thread
            if proc.exitcode not in (0, -signal.SIGTERM, None):
                log.error("%s (pid %s) exited with code %s", proc.name, proc.pid, proc.exitcode)


def _stop(procs: list[BaseProcess]) -> None:
    """SIGTERM each (API servers first, the core last), then wait; kill what lingers."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
