"""Every knob of mmserve in one place: one dataclass per subsystem.

CLI flags map 1:1 onto these fields; each dataclass validates itself in
``__post_init__`` so a bad value fails where it is set, with a message that says
what is allowed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DEFAULT_MODEL = "smollm2-135m-instruct"
FP8_KV_CACHE_DTYPES = ("fp8_e4m3", "fp8")  # e4m3 values + per-token, per-kv-head scales
KV_CACHE_DTYPES = ("auto", *FP8_KV_CACHE_DTYPES)


@dataclass
class EngineConfig:
    """Engine settings. ``model=None`` means the default model."""

    model: str | None = None
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
    max_model_len: int | None = None  # None: the model's own context length (capped at 8192)
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: sized from kv_cache_memory_mb
    # sizes left None are chosen from the device and the model (mmserve.engine.defaults):
    # CPU 512 MiB / 32 / 512; CUDA a share of the free memory / 256 / 8192 (>= 40 GiB)
    kv_cache_memory_mb: int | None = None
    kv_cache_memory_fraction: float = 0.5  # CUDA, kv_cache_memory_mb unset: of free memory
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | fp8_e4m3 (alias fp8)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # while other prompts wait to prefill, one prompt's chunk of a step holds at most this
    # many tokens (None: max_num_batched_tokens // 4); decodes always come first
    prefill_chunk_tokens: int | None = None
    max_waiting: int = 256
    # vision: "auto" (the shipped default connector when the model is the LM it was
    # trained for) | "none" | a connector directory
    connector: str | None = "auto"
    encoder_cache_mb: int = 256  # encoder outputs (image embeddings) kept by content hash
    enable_prefix_caching: bool = True
    # build the structured-output grammar compiler (xgrammar's import, the vocabulary) in a
    # background thread at start-up, so the first constrained request does not stall the loop
    preload_grammar: bool = True
    # threads of a step's batched grammar-mask fill: 0 fills fewer than 64 rows on the
    # engine's thread (no pool to wake: at batch 32 on an H100 host 119 us a step against
    # 203-410 us on a pool of 2-8) and more on a pool of half the CPUs (at most 4); n >= 1
    # always uses n threads
    grammar_fill_threads: int = 0
    batch_invariant: bool = True
    enforce_eager: bool = False  # CUDA: never capture/replay decode steps as CUDA graphs
    # CUDA: run every step shape a request can reach once at start-up, so no request pays
    # a kernel compile (mmserve.engine.warmup); the CPU compiles nothing
    warmup: bool = True
    # CUDA: launch a decode step (greedy or sampled) before the last one's tokens reach the host, so
    # the host's work for a step (stop checks, streaming, scheduling) runs while the GPU
    # computes the next (the engine's ``step`` docstring); off, or on CPU: one step at a time
    async_scheduling: bool = True
    seed: int = 0
    # vLLM-style JSON object (or dict), e.g. {"method": "ngram", "num_speculative_tokens": "auto"}
    speculative_config: str | dict | None = None
    # audio streams (mmserve.engine.deadlines): "deadline" serves frames by playback deadline
    # with admission control; "fifo" in arrival order, everyone admitted (the baseline)
    audio_scheduling: str = "deadline"
    audio_window: int | None = None  # audio rows a step at most (None: max_num_seqs)
    audio_lead_s: float = 1.0  # a stream this far ahead of its playback skips steps
    audio_queue_s: float = 1.0  # a new stream waits this long past its first-audio target

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            allowed = ", ".join(KV_CACHE_DTYPES)
            raise ValueError(
                f"kv_cache_dtype must be one of {allowed}, got {self.kv_cache_dtype!r}"
            )
        for name in (
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "kv_cache_memory_mb",
            "encoder_cache_mb",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.kv_cache_memory_fraction <= 0.95:
            raise ValueError(
                f"kv_cache_memory_fraction must be in (0, 0.95], got "
                f"{self.kv_cache_memory_fraction}"
            )
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be >= 1, got {self.prefill_chunk_tokens}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.grammar_fill_threads < 0:
            raise ValueError(
                f"grammar_fill_threads must be >= 0 (0: automatic), got {self.grammar_fill_threads}"
            )
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2, got {self.num_kv_blocks}")
        if self.audio_scheduling not in ("deadline", "fifo"):
            raise ValueError(
                f"audio_scheduling must be deadline or fifo, got {self.audio_scheduling!r}"
            )
        if self.audio_window is not None and self.audio_window < 1:
            raise ValueError(f"audio_window must be >= 1, got {self.audio_window}")
        if self.audio_lead_s <= 0 or self.audio_queue_s < 0:
            raise ValueError(
                "audio_lead_s must be > 0 and audio_queue_s >= 0, got "
                f"{self.audio_lead_s} and {self.audio_queue_s}"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        self.spec_config()  # validate early, with SpecConfig's messages

    def spec_config(self):  # -> SpecConfig | None (lazy import keeps config import-light)
        from mmserve.speculative.config import SpecConfig

        if self.speculative_config is None or self.speculative_config == "":
            return None
        return SpecConfig.from_json(self.speculative_config)


@dataclass
class ServerConfig:
    """HTTP/WebSocket server settings. ``api_key=None`` leaves every route open."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None  # None: the engine's model name
    max_body_bytes: int = 8 * 1024 * 1024  # larger request bodies / WS messages: HTTP 413
    tool_call_parser: str | None = None  # None: off | "auto": from the chat template | a format
    reasoning_parser: str | None = None  # None: off | "auto": from the chat template | a format
    log_level: str = "info"
    # -- limits on what one request or connection may hold (docs/reliability.md) --
    max_prompt_bytes: int = 1 << 20  # UTF-8 bytes of prompt text, checked before tokenizing
    max_stop_strings: int = 4  # stop strings per request
    max_stop_str_chars: int = 1024  # characters per stop string
    max_json_depth: int = 64  # nesting of a request body or a WS event
    realtime_max_items: int = 1024  # conversation items per Realtime session
    realtime_max_bytes: int = 4 << 20  # UTF-8 bytes of all items' text per Realtime session
    realtime_audio_buffer_ms: int = 200  # the client buffer spoken answers are scheduled for
    retry_after_s: int = 1  # the Retry-After header of a 429
    # -- connections --
    max_connections: int = 2048  # open HTTP/WS connections (the oldest idle one makes room)
    header_timeout_s: float = 10.0  # a request's line and headers must arrive within this
    body_timeout_s: float = 60.0  # ... and its body within this of its headers
    keep_alive_timeout_s: int = 5  # an idle keep-alive connection is closed after this
    ws_ping_interval_s: float = 20.0  # WebSocket pings; a peer silent past the timeout is dropped
    ws_ping_timeout_s: float = 20.0
    log_repeat_window_s: float = 60.0  # a repeated log line (same class) at most once per window
    engine_stall_timeout_s: float = 120.0  # /health answers 503 when one step runs longer
    # on SIGTERM/SIGINT, requests in flight may finish for this long; the rest are then
    # cancelled (an error as their last event, their KV blocks freed)
    shutdown_grace_s: float = 5.0
    # images in chat requests (served when the engine has a vision connector)
    max_images_per_request: int = 8
    max_image_bytes: int = 8 * 1024 * 1024  # encoded size of one image
    max_image_pixels: int = 25_000_000  # width x height, read from the header before decoding
    image_formats: str = "PNG,JPEG,WEBP,GIF,BMP"  # comma-separated PIL format names
    allow_remote_images: bool = False  # fetch http(s) image URLs
    allowed_local_media_path: str | None = None  # accept file paths under this directory
    remote_image_timeout_s: float = 10.0
    # -- processes (docs/architecture.md, "Process layout") --
    # None (both): chosen from the device at start-up (``resolve_layout``)
    engine_process: bool | None = None  # True: the step loop in an engine-core process
    api_server_count: int | None = None  # API-server processes sharing the port

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        for name in (
            "max_prompt_bytes",
            "max_stop_strings",
            "max_stop_str_chars",
            "max_json_depth",
            "realtime_max_items",
            "realtime_max_bytes",
            "realtime_audio_buffer_ms",
            "retry_after_s",
            "max_connections",
            "keep_alive_timeout_s",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "header_timeout_s",
            "body_timeout_s",
            "ws_ping_interval_s",
            "ws_ping_timeout_s",
            "log_repeat_window_s",
            "engine_stall_timeout_s",
            "shutdown_grace_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.api_server_count is not None and self.api_server_count < 1:
            raise ValueError(f"api_server_count must be >= 1, got {self.api_server_count}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be non-empty when set")
        for name in ("max_images_per_request", "max_image_bytes", "max_image_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        formats = {f.strip().upper() for f in self.image_formats.split(",") if f.strip()}
        known = {"PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"}
        if not formats or not formats <= known:
            raise ValueError(
                f"image_formats must be a comma-separated subset of "
                f"{', '.join(sorted(known))}, got {self.image_formats!r}"
            )
        if self.remote_image_timeout_s <= 0:
            raise ValueError(
                f"remote_image_timeout_s must be > 0, got {self.remote_image_timeout_s}"
            )
        levels = ("critical", "error", "warning", "info", "debug", "trace")
        if self.log_level not in levels:
            allowed = ", ".join(levels)
            raise ValueError(f"log_level must be one of {allowed}, got {self.log_level!r}")

    @property
    def split(self) -> bool:
        """The step loop runs in an engine-core process, API servers in others (the layout
        resolved: ``resolve_layout``)."""
        return bool(self.engine_process) or (self.api_server_count or 1) > 1

    def resolve_layout(self, cuda: bool, cpus: int) -> ServerConfig:
        """The process layout with what was left unset chosen (docs/configuration.md):
        on a CUDA device, the engine core in a process of its own and ``cpus // 4`` API
        servers (1 to 4): a GPU step loop runs faster than one event loop can stream its
        tokens, and sharing that loop's GIL with it halves both; on a CPU, one process
        (its steps are slower than any event loop). ``api_server_count`` > 1 implies the
        core's process; ``--no-engine-process`` keeps one process."""
        engine_process = self.engine_process
        if engine_process is None:
            engine_process = cuda or (self.api_server_count or 1) > 1
        count = self.api_server_count
        if count is None:
            count = max(1, min(4, cpus // 4)) if engine_process and cuda else 1
        if not engine_process and count > 1:
            raise ValueError("api_server_count > 1 needs the engine-core process")
        return dataclasses.replace(self, engine_process=engine_process, api_server_count=count)


@dataclass
class SpeechConfig:
    """Speech output (``POST /v1/audio/speech``): which voice the server loads."""

    voice: str = "default"  # "default": the voice shipped in tts/voices | a voice dir | "none"
    snac: str | None = None  # an Orpheus voice's SNAC decoder dir (default: <voice>/snac)
    voice_device: str = "auto"  # auto | cpu | cuda
    voice_max_num_seqs: int = 32  # voice pieces decoded together
    voice_kv_cache_memory_mb: int = 256
    # a stream's later audio chunks hold up to this much audio, decoded in one codec call
    # (its first chunk is one frame; 0: every frame decodes as it completes)
    voice_max_chunk_ms: int = 320
    max_speech_input_chars: int = 4096  # longer inputs get HTTP 400 (OpenAI's limit)

    def __post_init__(self) -> None:
        if self.voice_device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"voice_device must be auto, cpu or cuda, got {self.voice_device!r}")
        for name in ("voice_max_num_seqs", "voice_kv_cache_memory_mb", "max_speech_input_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.voice_max_chunk_ms < 0:
            raise ValueError(f"voice_max_chunk_ms must be >= 0, got {self.voice_max_chunk_ms}")

    @property
    def enabled(self) -> bool:
        return self.voice.lower() != "none"
