"""The messages between API servers and the engine-core process, and their encoding.

Messages are msgspec structs encoded as msgpack. Engine dataclasses
(``SamplingParams``, ``AudioSpec``, ``RequestOutput``, ``EngineStats``) travel as they are;
tensors and numpy arrays (an image's pixel tensor in a pending ``EmbeddingSpan``, a voice
delta's PCM) travel as msgpack extensions holding dtype, shape and raw bytes, so nothing is
pickled and a decoded message holds only plain data.

Sockets (``core_process`` binds, ``core_client`` connects):

- requests: the core's ROUTER <-> one DEALER per API server. ``Add`` / ``Abort`` in;
  ``Outputs`` (one message per member engine per step per API server) and ``Failed`` out.
- control: a second ROUTER served by a thread of the core, so it answers while a step runs:
  ``Probe`` -> ``Health`` (is the loop alive, how long has the current step run, stats).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import msgspec
import numpy as np
import torch

from mmserve import errors
from mmserve.engine.outputs import EngineStats, RequestOutput
from mmserve.engine.playback import AudioSpec
from mmserve.engine.request import EmbeddingSpan
from mmserve.sampling_params import SamplingParams

_TENSOR, _NDARRAY = 1, 2
LLM, VOICE = 0, 1  # member engines of one core: the LLM, and the voice sharing its loop


class WireSpan(msgspec.Struct, array_like=True):
    """An ``EmbeddingSpan`` (its tensors as extensions)."""

    start: int
    vectors: Any
    digest: bytes
    payload: Any
    source: bytes
    length: int
    offset: int


class Add(msgspec.Struct, tag="add", array_like=True):
    engine: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    spans: list[WireSpan] | None = None
    stage_seed: int | None = None  # the voice's AudioRequest(seed): decode to PCM
    audio: AudioSpec | None = None


class Abort(msgspec.Struct, tag="abort", array_like=True):
    engine: int
    request_id: str


class Outputs(msgspec.Struct, tag="out", array_like=True):
    engine: int
    outputs: list[RequestOutput]


class Failed(msgspec.Struct, tag="fail", array_like=True):
    """A request that ended in an error (refused at admission, or its step failed)."""

    engine: int
    request_id: str
    kind: str  # the exception's class name, rebuilt by ``error_from``
    message: str


class Probe(msgspec.Struct, tag="probe", array_like=True):
    seq: int


class Health(msgspec.Struct, tag="health", array_like=True):
    seq: int
    alive: bool  # False: the step loop has ended (``reason`` says why)
    step_seconds: float  # how long the step running now has run; 0.0 between steps
    stats: list[EngineStats]  # per member engine
    reason: str = ""


class MemberInfo(msgspec.Struct):
    """What an API server needs to know of one engine in the core to serve it."""

    name: str
    max_model_len: int
    max_waiting: int
    vocab_size: int
    sample_rate: int = 0  # a voice: its audio stage's rate; 0: text
    frame_s: float = 0.0  # a voice: seconds of audio per codec frame


class CoreInfo(msgspec.Struct):
    """The core's answer to ``Describe``: where the CPU halves live, and its members."""

    pid: int
    model_path: str  # the LLM's tokenizer is loaded from here
    connector_path: str | None  # the vision connector's image processor, if one is served
    members: list[MemberInfo]  # the LLM, then the voice if one is served


class Describe(msgspec.Struct, tag="describe", array_like=True):
    pass


ToCore = Add | Abort
FromCore = Outputs | Failed
Control = Probe | Describe


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        return msgspec.msgpack.Ext(_TENSOR, _array_bytes(dtype, list(t.shape), raw.numpy()))
    if isinstance(obj, np.ndarray):
        return msgspec.msgpack.Ext(_NDARRAY, _array_bytes(str(obj.dtype), list(obj.shape), obj))
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot send a {type(obj).__name__} to the engine core")


def _array_bytes(dtype: str, shape: list[int], arr: np.ndarray) -> bytes:
    return msgspec.msgpack.encode((dtype, shape, np.ascontiguousarray(arr).tobytes()))


def _ext_hook(code: int, data: memoryview) -> Any:
    dtype, shape, raw = msgspec.msgpack.decode(data)
    if code == _NDARRAY:
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    if code == _TENSOR:
        np_dtype = np.int16 if dtype == "bfloat16" else np.dtype(dtype)
        t = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).reshape(shape).copy())
        return t.view(torch.bfloat16) if dtype == "bfloat16" else t
    raise ValueError(f"unknown extension type {code}")


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder(enc_hook=_enc_hook)


def decoder(kind: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(kind, ext_hook=_ext_hook)


def to_wire(spans: list[EmbeddingSpan] | None) -> list[WireSpan] | None:
    if not spans:
        return None
    return [
        WireSpan(s.start, s.vectors, s.digest, s.payload, s.source, s.length, s.offset)
        for s in spans
    ]


def from_wire(spans: list[WireSpan] | None) -> list[EmbeddingSpan] | None:
    if not spans:
        return None
    return [
        EmbeddingSpan(s.start, s.vectors, s.digest, s.payload, s.source, s.length, s.offset)
        for s in spans
    ]


def owner_id(pid: int, n: int) -> bytes:
    """The identity of an API server's request socket: its pid, so the core can tell when
    the process behind it is gone (``EngineCore`` then drops its requests)."""
    return f"{pid}:{n}".encode()


def owner_pid(owner: bytes) -> int | None:
    head = owner.split(b":", 1)[0]
    return int(head) if head.isdigit() else None


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (same host: the processes are siblings)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    return True


def failure(engine: int, request_id: str, exc: BaseException) -> Failed:
    return Failed(engine, request_id, type(exc).__name__, str(exc))


_BUILTIN = {c.__name__: c for c in (ValueError, RuntimeError, TypeError, KeyError)}


def error_from(failed: Failed) -> Exception:
    """The exception a ``Failed`` stands for: an ``mmserve.errors`` class (the server maps
    its status), a builtin one, else a ``RuntimeError`` naming the original class."""
    for cls in _error_classes(errors.MMServeError):
        if cls.__name__ == failed.kind:
            return cls(failed.message)
    if failed.kind in _BUILTIN:
        return _BUILTIN[failed.kind](failed.message)
    return RuntimeError(f"{failed.kind}: {failed.message}")


def _error_classes(base: type) -> list[type]:
    found: list[type] = [base]
    child: type
    for child in base.__subclasses__():
        found.extend(_error_classes(child))
    return found
