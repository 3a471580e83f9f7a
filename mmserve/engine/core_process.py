"""Starting the engine core in a process of its own, and finding out when it is ready.

``start_core`` spawns (never forks: CUDA) a process that builds the LLM engine, the
vision connector's encoder and, when speech is on, the voice engine stepped by the same
loop; binds the request and control sockets; and runs ``EngineCore``. ``wait_ready``
asks the control socket for the core's ``CoreInfo`` and fails fast if the process dies
while it loads. The core stops when its parent goes away or on SIGTERM (between steps);
SIGINT is left to the parent, which shuts the core down in order.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import zmq

from mmserve.config import EngineConfig, SpeechConfig
from mmserve.engine import wire
from mmserve.engine.core import EngineCore, Member
from mmserve.procname import name_this_thread

log = logging.getLogger("mmserve")


@dataclass(frozen=True)
class CoreAddress:
    """Where a core listens (``ipc://`` paths in a private directory)."""

    requests: str
    control: str

    @classmethod
    def fresh(cls) -> CoreAddress:
        d = Path(tempfile.mkdtemp(prefix="mmserve-core-"))
        return cls(f"ipc://{d}/requests", f"ipc://{d}/control")


def start_core(
    engine_config: EngineConfig,
    speech_config: SpeechConfig | None,
    address: CoreAddress,
    log_level: str = "info",
) -> BaseProcess:
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(
        target=core_main,
        name="mmserve-engine-core",
        daemon=False,
        args=(engine_config, speech_config, address, log_level, os.getpid()),
    )
    proc.start()
    return proc


def wait_ready(
    address: CoreAddress, proc: BaseProcess | None = None, timeout: float = 3600.0
) -> wire.CoreInfo:
    """The core's ``CoreInfo`` once it has loaded; raises if ``proc`` dies first."""
    ctx: zmq.Context = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address.control)
    try:
        sock.send(wire.encoder().encode(wire.Describe()))
        deadline = time.monotonic() + timeout
        while not sock.poll(200):
            if proc is not None and not proc.is_alive():
                raise RuntimeError(
                    f"the engine core process exited with code {proc.exitcode} "
                    "while loading (see its log above)"
                )
            if time.monotonic() > deadline:
                raise TimeoutError("the engine core did not become ready")
        return wire.decoder(wire.CoreInfo).decode(sock.recv())
    finally:
        sock.close()


def core_main(
    engine_config: EngineConfig,
    speech_config: SpeechConfig | None,
    address: CoreAddress,
    log_level: str,
    parent_pid: int,
) -> None:
    """The core process: load, bind, run the loop on a thread, answer probes on this one."""
    logging.basicConfig(
        level=log_level.upper() if log_level != "trace" else "DEBUG",
        format="%(levelname)s %(name)s (core): %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    name_this_thread("mmserve-core")
    core = EngineCore(*_build(engine_config, speech_config))
    signal.signal(signal.SIGTERM, lambda *_: setattr(core, "stopping", True))
    ctx = zmq.Context()
    requests = ctx.socket(zmq.ROUTER)
    control = ctx.socket(zmq.ROUTER)
    for sock, where in ((requests, address.requests), (control, address.control)):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # outputs are never dropped; the client drains them
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.bind(where)
    # The loop runs on a thread, as ``AsyncEngine``'s does: CPU kernels then run under the
    # same threading as in-process (an OpenMP team driven from the main thread spin-waits
    # far longer on a busy host), and the main thread stays free to answer probes.
    loop = threading.Thread(target=_run, args=(core, requests), name="mmserve-engine")
    loop.start()
    try:
        _control(core, control, loop, parent_pid)
    finally:
        core.stopping = True
        loop.join()


def _run(core: EngineCore, requests: zmq.Socket) -> None:
    name_this_thread("mmserve-engine")
    try:
        core.run(requests)
    finally:
        requests.close()
        for m in core.members:
            if m.stage is not None and hasattr(m.stage, "release_all"):
                m.stage.release_all()


def _control(core: EngineCore, sock: zmq.Socket, loop: threading.Thread, parent_pid: int) -> None:
    """Serve probes until the loop ends; stop the loop if the parent is gone (an orphaned
    core holds a GPU)."""

    def done() -> bool:
        if os.getppid() != parent_pid:
            core.stopping = True
        return not loop.is_alive()

    core.serve_control(sock, loop, done)


def _build(
    engine_config: EngineConfig, speech_config: SpeechConfig | None
) -> tuple[list[Member], wire.CoreInfo]:
    from connectors.loader import resolve_connector
    from mmserve.engine.factory import create_engine, model_name
    from mmserve.models.hub import resolve_model

    path = resolve_model(engine_config.model)
    llm = create_engine(engine_config)
    connector = (
        resolve_connector(engine_config.connector, model_name(engine_config), path)
        if llm.connector is not None
        else None
    )
    members = [Member(llm)]
    infos = [_member_info(model_name(engine_config), llm)]
    voice = _voice(speech_config) if speech_config is not None and speech_config.enabled else None
    if voice is not None:
        member, info = voice
        members.append(member)
        infos.append(info)
    return members, wire.CoreInfo(
        os.getpid(), str(path), str(connector) if connector else None, infos
    )


def _voice(config: SpeechConfig) -> tuple[Member, wire.MemberInfo] | None:
    from tts.engine import voice_engine
    from tts.registry import DEFAULT_VOICE_DIR, load

    if config.voice == "default" and not (DEFAULT_VOICE_DIR / "voice.json").is_file():
        return None  # the API server says so (it looks for the same file)
    v = load(config.voice, config.snac)
    engine, stage = voice_engine(
        v,
        config.voice_device,
        max_num_seqs=config.voice_max_num_seqs,
        kv_cache_memory_mb=config.voice_kv_cache_memory_mb,
        max_chunk_s=config.voice_max_chunk_ms / 1000,
    )
    info = _member_info(v.name, engine)
    info.sample_rate, info.frame_s = stage.sample_rate, stage.codec.frame_duration
    return Member(engine, stage), info


def _member_info(name: str, engine: Any) -> wire.MemberInfo:
    """``engine``: an ``LLMEngine``."""
    return wire.MemberInfo(
        name, engine.max_model_len, engine.config.max_waiting, engine.tokenizer.vocab_size
    )
