"""Run the app under uvicorn: load the engine, bind, announce, serve, shut down.

``run_server`` is what ``mmserve serve`` calls. It prints one line naming the
model and the address once the socket is bound (with ``--port 0`` that is the
port the OS picked), and always shuts the engine down on the way out.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import sys
from typing import TextIO

import uvicorn

from mmserve.config import EngineConfig, ServerConfig, SpeechConfig
from mmserve.procname import name_this_thread
from mmserve.server.app import create_app
from mmserve.server.connections import ConnectionLimits, guarded_httptools
from mmserve.server.engine_client import EngineClient
from mmserve.server.log_limits import install_repeat_filter

SHUTDOWN_FLUSH_S = 2.0  # after the engine cancels at shutdown: time to write the endings


def uvicorn_config(app: object, config: ServerConfig) -> uvicorn.Config:
    """The uvicorn settings mmserve runs with: WS message limit = the HTTP body limit, the
    connection limits of ``connections.guarded_httptools``, repeated log lines folded."""
    limits = ConnectionLimits(
        config.max_connections, config.header_timeout_s, config.body_timeout_s, config.retry_after_s
    )
    uv = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        http=guarded_httptools(limits),
        ws_max_size=config.max_body_bytes,
        ws_ping_interval=config.ws_ping_interval_s,
        ws_ping_timeout=config.ws_ping_timeout_s,
        timeout_keep_alive=config.keep_alive_timeout_s,
        # uvicorn cancels what still runs after this; DrainingServer has cancelled it in
        # the engine SHUTDOWN_FLUSH_S earlier, so that time goes to writing the endings
        timeout_graceful_shutdown=math.ceil(config.shutdown_grace_s + SHUTDOWN_FLUSH_S),
        access_log=config.log_level in ("debug", "trace"),
    )
    install_repeat_filter(config.log_repeat_window_s)  # uvicorn.Config set up its handlers
    return uv


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a draining shutdown. On SIGTERM/SIGINT it stops accepting
    and lets the requests in flight run on for ``shutdown_grace_s``; the engine then
    cancels those still running, so each ends with an error its client can read (an SSE
    error chunk, a Realtime ``error`` event) and its blocks are freed, and uvicorn closes
    whatever is left ``SHUTDOWN_FLUSH_S`` later."""

    def __init__(self, config: uvicorn.Config, engine: object, grace_s: float) -> None:
        super().__init__(config)
        self.engine, self.grace_s = engine, grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        cancel = getattr(self.engine, "cancel_in_flight", None)  # test engines may lack it
        timer = (
            asyncio.get_running_loop().call_later(self.grace_s, cancel)
            if cancel is not None
            else None
        )
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()


def make_server(app: object, engine: object, config: ServerConfig) -> DrainingServer:
    return DrainingServer(uvicorn_config(app, config), engine, config.shutdown_grace_s)


def bound_address(server: uvicorn.Server, config: ServerConfig) -> tuple[str, int]:
    for srv in getattr(server, "servers", []):
        for sock in srv.sockets:
            host, port = sock.getsockname()[:2]
            return str(host), int(port)
    return config.host, config.port


async def serve_app(
    engine: EngineClient,
    config: ServerConfig,
    out: TextIO | None = sys.stdout,
    speech: object = None,
    max_speech_input_chars: int = 4096,
    sockets: list[socket.socket] | None = None,
    metrics_dir: str | None = None,
) -> None:
    """Serve ``engine`` until uvicorn stops (SIGINT/SIGTERM); announce the address on ``out``
    (None: stay quiet). ``sockets``: listen on these (already bound) instead of binding;
    ``metrics_dir``: see ``create_app``."""
    app = create_app(engine, config, speech, max_speech_input_chars, metrics_dir)
    server = make_server(app, engine, config)
    task = asyncio.create_task(server.serve(sockets=sockets))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started and out is not None:
        host, port = bound_address(server, config)
        name = config.served_model_name or engine.model_name
        print(
            f"mmserve: serving {name} on http://{host}:{port} "
            f"(OpenAI API at http://{host}:{port}/v1, Realtime at ws://{host}:{port}/v1/realtime)",
            file=out,
            flush=True,
        )
    await task


def run_server(
    engine_config: EngineConfig,
    server_config: ServerConfig,
    speech_config: SpeechConfig | None = None,
) -> int:
    """Load the model (and the voice), serve, and shut the engines down when it stops: on
    a thread of this process, or (``server_config.split``) in an engine-core process of its
    own with API servers in others (``launch_split``)."""
    setup_logging(server_config)
    raise_fd_limit()
    print(f"mmserve: loading {engine_config.model or 'the default model'} ...", flush=True)
    from mmserve.engine.factory import resolve_device

    cuda = resolve_device(engine_config.device).type == "cuda"
    server_config = server_config.resolve_layout(cuda, os.cpu_count() or 1)
    if server_config.split:
        from mmserve.server.launch_split import run_split

        return run_split(engine_config, server_config, speech_config or SpeechConfig())
    return _run_in_process(engine_config, server_config, speech_config)


def setup_logging(config: ServerConfig) -> None:
    logging.basicConfig(
        level=config.log_level.upper() if config.log_level != "trace" else "DEBUG",
        format="%(levelname)s %(name)s: %(message)s",
    )
    install_repeat_filter(config.log_repeat_window_s)


def _run_in_process(
    engine_config: EngineConfig, server_config: ServerConfig, speech_config: SpeechConfig | None
) -> int:
    from mmserve.engine.async_engine import AsyncEngine

    name_this_thread("mmserve-api")
    engine = AsyncEngine.from_config(engine_config)
    speech_config = speech_config or SpeechConfig()
    speech = start_speech(speech_config, engine) if speech_config.enabled else None
    # uvicorn re-raises the signal it caught once it has drained; make SIGTERM an exit
    # that unwinds (and shuts the engine down) instead of killing the process outright.
    signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        asyncio.run(
            serve_app(
                engine,
                server_config,
                speech=speech,
                max_speech_input_chars=speech_config.max_speech_input_chars,
            )
        )
    except KeyboardInterrupt:
        pass
    finally:
        engine.shutdown_sync()
        if speech is not None:
            speech.shutdown()
        print(
            f"mmserve: stopped; {engine.cancelled_at_shutdown} request(s) cancelled at "
            f"shutdown, {engine.stats().kv_blocks_used} KV block(s) in use",
            flush=True,
        )
    return 0


def start_speech(config: SpeechConfig, text_engine: object = None):  # -> SpeechService | None
    """The voice's engine and audio stage, for ``/v1/audio/speech`` and spoken Realtime
    answers, stepped by the LLM's own loop when that runs in this process (None, with a
    warning, when the default voice is asked for but not installed)."""
    from mmserve.engine.async_engine import AsyncEngine
    from tts.registry import DEFAULT_VOICE_DIR
    from tts.service import SpeechService

    if config.voice == "default" and not (DEFAULT_VOICE_DIR / "voice.json").is_file():
        print(
            f"mmserve: no default voice in {DEFAULT_VOICE_DIR} (build it with `mmserve voice "
            "train`); /v1/audio/speech is off",
            flush=True,
        )
        return None
    print(f"mmserve: loading voice {config.voice} ...", flush=True)
    return SpeechService.start(
        config.voice,
        config.voice_device,
        config.snac,
        share_loop_with=text_engine if isinstance(text_engine, AsyncEngine) else None,
        max_num_seqs=config.voice_max_num_seqs,
        kv_cache_memory_mb=config.voice_kv_cache_memory_mb,
        max_chunk_s=config.voice_max_chunk_ms / 1000,
    )


def exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(0)


def raise_fd_limit() -> None:
    """Let the process open as many sockets as the hard limit allows (``max_connections``
    is the cap that matters; the soft limit is often far below it)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
