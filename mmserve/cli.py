"""The ``mmserve`` command: ``serve | pull | chat | generate`` (more register the same way).

Engine and server flags are generated from ``EngineConfig`` / ``ServerConfig``
fields, one flag per field (``max_model_len`` → ``--max-model-len``), so a new
config field is a new flag with no CLI change, and an omitted flag keeps the
dataclass default. A subcommand is one function decorated with
:func:`subcommand`, naming the flag groups it takes::

    @subcommand("bench", "measure throughput", engine_flags)
    def bench(args: argparse.Namespace) -> int: ...
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from mmserve import __version__
from mmserve.config import DEFAULT_MODEL, EngineConfig, ServerConfig, SpeechConfig
from mmserve.sampling_params import SamplingParams

C = TypeVar("C")
Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

HELP = {
    "model": f"model name or path (.gguf file or model directory); default {DEFAULT_MODEL}",
    "device": "auto | cpu | cuda",
    "dtype": "auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16",
    "max_model_len": "context length; default: the model's own (capped at 8192)",
    "num_kv_blocks": "KV-cache blocks; default: sized from --kv-cache-memory-mb",
    "kv_cache_memory_mb": "memory for the KV cache in MiB (default: CPU 512; CUDA "
    "--kv-cache-memory-fraction of the memory free after the weights, capped at what "
    "--max-num-seqs sequences of --max-model-len tokens use)",
    "kv_cache_memory_fraction": "CUDA, --kv-cache-memory-mb unset: the share of free device "
    "memory the KV cache takes (default: 0.5)",
    "kv_cache_dtype": "auto (the model's dtype) | fp8_e4m3 (alias fp8): e4m3 keys/values with "
    "per-token, per-head scales, about twice the blocks of bf16 for the same memory",
    "max_num_seqs": "most sequences decoded together (default: CPU 32; CUDA 256, 128 below 16 GiB)",
    "max_num_batched_tokens": "token budget of one engine step (decodes first, then prefill "
    "chunks; default: CPU 512; CUDA 8192 from 40 GiB, 4096 from 16 GiB, else 2048)",
    "prefill_chunk_tokens": "most tokens of one prompt's prefill chunk in a step while other "
    "prompts wait to prefill (default: max_num_batched_tokens // 4)",
    "max_waiting": "bound of the waiting queue; a full queue answers HTTP 429",
    "warmup": "CUDA: run every step shape a request can reach once at start-up, so the "
    "first requests pay no kernel compiles (default: on)",
    "async_scheduling": "CUDA: launch the next decode step (greedy or sampled) before the "
    "last one's tokens reach the host, hiding the host's per-step work behind the GPU "
    "(default: on)",
    "audio_scheduling": "deadline: audio frames by playback deadline, new streams admitted "
    "only when every stream can still play in real time | fifo: arrival order, all admitted",
    "audio_window": "most audio streams in one step; default --max-num-seqs",
    "audio_lead_s": "an audio stream this many seconds ahead of its playback skips steps",
    "audio_queue_s": "a new audio stream waits this long past its first-audio target, then "
    "is refused",
    "host": "address to bind",
    "port": "port to bind (0: any free port)",
    "api_key": "require 'Authorization: Bearer <key>' on HTTP and WebSocket "
    "(default: $MMSERVE_API_KEY, else open)",
    "served_model_name": "model name the API advertises; default: the model's name",
    "max_body_bytes": "largest request body / WebSocket message; larger ones get HTTP 413",
    "tool_call_parser": "tool-call format to parse from the output, or 'auto' (from the chat "
    "template); default off",
    "reasoning_parser": "reasoning format to parse from the output, or 'auto'; default off",
    "connector": "vision connector: auto (the shipped default when serving the LM it was "
    "trained for), none, or a connector directory (default: auto)",
    "encoder_cache_mb": "memory for cached image encodings, kept by content hash",
    "preload_grammar": "build the structured-output grammar compiler in the background at "
    "start-up, so the first constrained request does not stall the engine (default: on)",
    "grammar_fill_threads": "threads of a step's batched grammar-mask fill (default 0: the "
    "engine's thread below 64 rows, else half the CPUs, at most 4; 1: always the engine's "
    "thread)",
    "max_images_per_request": "most images in one chat request",
    "max_image_bytes": "largest encoded image (bytes)",
    "max_image_pixels": "largest image (width x height), checked before decoding",
    "image_formats": "accepted image formats, comma-separated",
    "allow_remote_images": "fetch http(s) image URLs (default: off; data: URLs only)",
    "allowed_local_media_path": "accept local image paths under this directory (default: off)",
    "remote_image_timeout_s": "timeout for fetching a remote image",
    "engine_process": "run the engine's step loop in an engine-core process of its own, "
    "the API servers (HTTP, templates, detokenization, parsers) in others, talking over "
    "ZeroMQ; --no-engine-process: the loop on a thread of the one API server (default: "
    "on with a CUDA device, off on a CPU)",
    "api_server_count": "API-server processes on the one port, all served by one engine "
    "core; > 1 implies --engine-process (default: a quarter of the CPU cores, 1 to 4, "
    "with a CUDA device; else 1)",
    "voice_max_chunk_ms": "a stream's later audio chunks hold up to this much audio, decoded "
    "in one codec call (its first chunk is one frame; 0: every frame decodes as it "
    "completes; default 320)",
}


@dataclasses.dataclass
class Subcommand:
    name: str
    help: str
    configure: list[Configure]
    run: Run


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, help: str, *configure: Configure) -> Callable[[Run], Run]:
    """Register ``fn(args) -> exit code`` as ``mmserve NAME`` with the given flag groups."""

    def register(fn: Run) -> Run:
        SUBCOMMANDS[name] = Subcommand(name, help, list(configure), fn)
        return fn

    return register


def _flag_type(hint: Any) -> tuple[Any, bool]:
    """(argparse type, is_bool) for a field annotation such as ``int | None``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint, hint is bool


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def dataclass_flags(cls: type, only: tuple[str, ...] | None = None) -> Configure:
    """A flag group with one ``--flag`` per field of the dataclass ``cls``."""

    def configure(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(f"{cls.__name__} options")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if only is not None and f.name not in only or typing.get_origin(hints[f.name]) is list:
                continue
            kind, is_bool = _flag_type(hints[f.name])
            default = _default(f)
            text = HELP.get(f.name, f.name.replace("_", " "))
            if "default" not in text:
                text += f" (default: {default})"
            flag = "--" + f.name.replace("_", "-")
            if is_bool:
                group.add_argument(
                    flag,
                    dest=f.name,
                    action=argparse.BooleanOptionalAction,
                    default=argparse.SUPPRESS,
                    help=text,
                )
            else:
                group.add_argument(
                    flag,
                    dest=f.name,
                    type=kind,
                    default=argparse.SUPPRESS,
                    metavar=f.name.upper(),
                    help=text,
                )

    return configure


def config_from(cls: type[C], args: argparse.Namespace) -> C:
    """Build ``cls`` from the flags given; the rest keep the dataclass defaults."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given = {k: v for k, v in vars(args).items() if k in names}
    return cls(**given)


engine_flags = dataclass_flags(EngineConfig)
server_flags = dataclass_flags(ServerConfig)
speech_flags = dataclass_flags(SpeechConfig)
sampling_flags = dataclass_flags(
    SamplingParams, ("temperature", "top_p", "top_k", "max_tokens")
)  # --seed comes from EngineConfig and seeds the sampling too


@subcommand(
    "serve",
    "serve a model over the OpenAI HTTP API and the Realtime WebSocket",
    engine_flags,
    server_flags,
    speech_flags,
)
def serve(args: argparse.Namespace) -> int:
    from mmserve import envs
    from mmserve.server.launch import run_server

    server_config = config_from(ServerConfig, args)
    if server_config.api_key is None:
        server_config.api_key = envs.MMSERVE_API_KEY
    return run_server(
        config_from(EngineConfig, args), server_config, config_from(SpeechConfig, args)
    )


def _pull_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help=f"known model name (default {DEFAULT_MODEL})")
    parser.add_argument("--model", dest="model", default=None, help="same as NAME")
    parser.add_argument("--list", action="store_true", help="list the known model names")


@subcommand("pull", "download and convert a known model into the local cache", _pull_flags)
def pull(args: argparse.Namespace) -> int:
    from mmserve.models.hub import KNOWN_MODELS
    from mmserve.models.hub import pull as hub_pull

    if args.list:
        print("\n".join(sorted(KNOWN_MODELS)))
        return 0
    name = args.name or args.model or DEFAULT_MODEL
    if name not in KNOWN_MODELS:
        print(
            f"mmserve: unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}",
            file=sys.stderr,
        )
        return 2
    print(hub_pull(name, progress=True))
    return 0


async def _stream(engine: Any, prompt_ids: list[int], params: SamplingParams) -> str:
    text = ""
    async for out in engine.generate(prompt_ids, params):
        print(out.new_text, end="", flush=True)
        text = out.text
    print()
    return text


def _chat_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system", default=None, help="system prompt")


@subcommand(
    "chat",
    "chat with a model in the terminal (no server)",
    engine_flags,
    sampling_flags,
    _chat_flags,
)
def chat(args: argparse.Namespace) -> int:
    from mmserve.engine.async_engine import AsyncEngine

    engine = AsyncEngine.from_config(config_from(EngineConfig, args))
    messages: list[dict[str, str]] = (
        [{"role": "system", "content": args.system}] if args.system else []
    )
    print(f"mmserve: chatting with {engine.model_name}; an empty line or Ctrl-D quits")
    try:
        while True:
            try:
                line = input("> ").strip()
            except EOFError:
                break
            if not line or line in ("/exit", "/quit"):
                break
            messages.append({"role": "user", "content": line})
            prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            ids = engine.tokenizer.encode(prompt)
            reply = asyncio.run(_stream(engine, ids, config_from(SamplingParams, args)))
            messages.append({"role": "assistant", "content": reply})
    except KeyboardInterrupt:
        print()
    finally:
        engine.shutdown_sync()
    return 0


def _generate_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    parser.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user message in the chat template"
    )


@subcommand(
    "generate",
    "complete one prompt and print the text (no server)",
    engine_flags,
    sampling_flags,
    _generate_flags,
)
def generate(args: argparse.Namespace) -> int:
    from mmserve.engine.async_engine import AsyncEngine

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    engine = AsyncEngine.from_config(config_from(EngineConfig, args))
    try:
        tok = engine.tokenizer
        if args.chat:
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True
            )
        asyncio.run(
            _stream(
                engine,
                tok.encode(prompt, add_special_tokens=not args.chat),
                config_from(SamplingParams, args),
            )
        )
    finally:
        engine.shutdown_sync()
    return 0


def _bench_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "which",
        choices=(
            "spec",
            "throughput",
            "stress",
            "vision",
            "speech",
            "structured",
            "voice",
            "serve",
        ),
        help="spec: speculative vs plain decode on the real model (CPU or GPU); "
        "throughput: engine vs HF transformers on random weights (CUDA); "
        "stress: fuzzing, abort storms, overload, soak of a live server "
        "(docs/reliability.md); "
        "vision: captioning images/s vs HF transformers (CPU or GPU); "
        "speech: time to first audio and real-time factor (CPU or GPU); "
        "structured: constrained vs free decode (docs/structured-output.md); "
        "voice: concurrent voice streams, deadline vs FIFO scheduling; "
        "serve: a live server (openai SDK streams, Realtime WebSocket) against "
        "the engine in-process",
    )
    parser.add_argument("--model", default=None, help=HELP["model"])
    parser.add_argument("--device", default="auto", help=HELP["device"])
    parser.add_argument(
        "--speculative-config",
        default=None,
        help='JSON, default {"method": "ngram", "num_speculative_tokens": "auto"}',
    )
    parser.add_argument(
        "--workloads", default="edit,code,chat,long", help="comma-separated: edit, code, chat, long"
    )
    parser.add_argument(
        "--concurrency",
        default=None,
        help="comma-separated; default 1,4,16 (spec), 1,8,32 (vision), 1,16,64,256 (serve)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="new tokens a request; default 96 (spec), 24 (vision), 256 (serve)",
    )
    parser.add_argument("--connector", default="auto", help="vision: " + HELP["connector"])
    parser.add_argument("--images", type=int, default=64, help="vision: images a concurrency level")
    parser.add_argument("--no-hf", action="store_true", help="vision: skip the HF baseline")
    parser.add_argument("--dtype", default="auto", help="vision: " + HELP["dtype"])
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="spec: interleaved plain/spec pairs a row (a row's floor verdict "
        "needs 5 or more: the interval for its median covers 90 %% then); structured, "
        "vision: timed passes a row (the median counts)",
    )
    parser.add_argument(
        "--fill-threads",
        default="0",
        help="structured: grammar_fill_threads settings, comma-separated, a row each "
        "(0: automatic; 1: the engine's thread alone; n: a pool of n)",
    )
    parser.add_argument("--out-dir", default="bench/out", help="where JSON and PNG go")
    stress = parser.add_argument_group("stress options")
    stress.add_argument(
        "--only",
        default=None,
        help="comma-separated phases (default all): fuzz-http, fuzz-ws, "
        "abort-storm, overload, slow-clients, long-prefill, eviction, soak",
    )
    stress.add_argument("--fuzz-inputs", type=int, default=10_000)
    stress.add_argument(
        "--fuzz-give-up-s",
        type=float,
        default=5.0,
        help="a fuzzing client gives up on an answer after this (the server "
        "must then abort the request); long fuzzed generations cost this each",
    )
    stress.add_argument(
        "--fuzz-workers",
        type=int,
        default=8,
        help="fuzzing clients at once, each a process (worker w uses seed + 1000 w); "
        "1 runs the fuzz phases in this process, one input at a time",
    )
    stress.add_argument("--aborts", type=int, default=1000)
    stress.add_argument("--soak-clients", type=int, default=64)
    stress.add_argument("--soak-s", type=float, default=1800.0)
    stress.add_argument("--max-num-seqs", type=int, default=8)
    stress.add_argument("--max-waiting", type=int, default=16)
    serve = parser.add_argument_group("serve options")
    serve.add_argument(
        "--serve-args",
        default="",
        help="extra flags for the served `mmserve serve` (and the in-process "
        'engine\'s config), one string, e.g. "--max-num-seqs 256"',
    )
    serve.add_argument(
        "--protocols", default="sse,ws", help="sse (openai SDK) and/or ws (Realtime WebSocket)"
    )
    serve.add_argument(
        "--requests-per-client",
        type=int,
        default=2,
        help="a load sends max(clients x this, --min-requests) requests",
    )
    serve.add_argument("--min-requests", type=int, default=8)
    serve.add_argument(
        "--burst",
        type=int,
        default=32,
        help="requests at once right after start and again when warm (0: skip)",
    )
    serve.add_argument(
        "--client-procs",
        type=int,
        default=0,
        help="client processes (default: the cores the served layout leaves, 1 to 16)",
    )
    serve.add_argument(
        "--no-engine", action="store_true", help="skip the in-process engine baseline"
    )
    speech = parser.add_argument_group("speech and voice options")
    speech.add_argument(
        "--streams",
        default=None,
        help="concurrent streams, comma-separated; default 1,8,32 (speech), "
        "1,8,32,64,128,256 (voice)",
    )
    speech.add_argument(
        "--voices",
        default=None,
        help="speech: default (the shipped voice), orpheus-3b (Llama-3B shape "
        "+ SNAC 24 kHz, random weights), or voice directories (default both "
        "named); voice: gepard-0.5b (random 0.5B backbone at Gepard's 80 ms "
        "frames) and/or default (default both)",
    )
    speech.add_argument("--seconds", type=float, default=4.0, help="audio each stream generates")
    speech.add_argument(
        "--chunk-ms",
        type=float,
        default=320.0,
        help="speech: most audio a stream's later chunks hold, one codec call each "
        "(0: every frame decodes as it completes, the ungrouped baseline)",
    )
    speech.add_argument("--buffer-ms", type=float, default=200.0, help="voice: the client's buffer")
    speech.add_argument("--ramp-s", type=float, default=1.0, help="voice: streams arrive over this")
    speech.add_argument(
        "--text-clients",
        type=int,
        default=16,
        help="voice: text clients beside the voice streams in the mixed load",
    )
    speech.add_argument(
        "--mixed-streams",
        default=None,
        help="voice: stream counts of the mixed load (default: half the largest)",
    )
    speech.add_argument(
        "--tiny",
        action="store_true",
        help="voice: a 2-layer backbone instead of 0.5B (to run it on a CPU)",
    )


@subcommand("bench", "measure speed against a baseline in the same run", _bench_flags)
def bench(args: argparse.Namespace) -> int:
    import json

    if args.which == "stress":
        from mmserve.bench.stress import PHASES, StressConfig, run_stress

        only = tuple(p for p in (args.only or ",".join(PHASES)).split(",") if p)
        device = "cpu" if args.device == "auto" else args.device
        results = run_stress(
            StressConfig(
                only=only,
                device=device,
                model=args.model,
                fuzz_inputs=args.fuzz_inputs,
                fuzz_give_up_s=args.fuzz_give_up_s,
                fuzz_workers=args.fuzz_workers,
                aborts=args.aborts,
                max_num_seqs=args.max_num_seqs,
                max_waiting=args.max_waiting,
                soak_clients=args.soak_clients,
                soak_s=args.soak_s,
                out_dir=args.out_dir,
            )
        )
        return int(any(r.crashes or r.status_5xx or r.leaked_blocks for r in results))
    if args.which == "speech":
        from mmserve.bench.speech import run_speech_bench

        run_speech_bench(
            (args.voices or "default,orpheus-3b").split(","),
            [int(s) for s in (args.streams or "1,8,32").split(",")],
            args.seconds,
            args.device,
            args.out_dir,
            args.chunk_ms,
        )
        return 0
    if args.which == "structured":
        from mmserve.bench.structured import run_structured_bench

        batches = tuple(int(c) for c in (args.concurrency or "1,32").split(",") if c)
        run_structured_bench(
            args.model,
            args.device,
            batches,
            args.max_tokens or 128,
            args.repeats,
            args.out_dir,
            tuple(int(t) for t in args.fill_threads.split(",") if t),
        )
        return 0
    if args.which == "voice":
        from mmserve.bench.voice import run_voice_bench

        mixed = args.mixed_streams
        run_voice_bench(
            [v for v in (args.voices or "gepard-0.5b,default").split(",") if v],
            [int(s) for s in (args.streams or "1,8,32,64,128,256").split(",")],
            args.seconds,
            args.device,
            args.out_dir,
            buffer_ms=args.buffer_ms,
            ramp_s=args.ramp_s,
            text_clients=args.text_clients,
            tiny=args.tiny,
            mixed_streams=[int(s) for s in mixed.split(",")] if mixed else None,
        )
        return 0
    if args.which == "serve":
        import shlex

        from mmserve.bench.serve import ServeBenchConfig, run_serve_bench

        run_serve_bench(
            ServeBenchConfig(
                model=args.model,
                device=args.device,
                concurrency=tuple(
                    int(c) for c in (args.concurrency or "1,16,64,256").split(",") if c
                ),
                max_tokens=args.max_tokens or 256,
                requests_per_client=args.requests_per_client,
                min_requests=args.min_requests,
                burst=args.burst,
                protocols=tuple(p for p in args.protocols.split(",") if p),
                engine=not args.no_engine,
                client_procs=args.client_procs,
                serve_args=tuple(shlex.split(args.serve_args)),
                out_dir=args.out_dir,
            ),
            lambda flags: config_from(EngineConfig, build_parser().parse_args(["serve", *flags])),
        )
        return 0
    if args.which == "throughput":
        from mmserve.bench.throughput import run_throughput

        run_throughput({"out_dir": args.out_dir})
        return 0
    default_conc, default_new = ("1,8,32", 24) if args.which == "vision" else ("1,4,16", 96)
    conc = tuple(int(c) for c in (args.concurrency or default_conc).split(",") if c)
    new_tokens = args.max_tokens or default_new
    if args.which == "vision":
        from mmserve.bench.vision import run_vision_bench

        run_vision_bench(
            args.connector,
            args.model,
            args.device,
            args.images,
            conc,
            new_tokens,
            args.out_dir,
            hf=not args.no_hf,
            dtype=args.dtype,
            repeats=max(1, args.repeats),
        )
        return 0
    from mmserve.bench.spec import run_spec_bench

    run_spec_bench(
        args.model,
        json.loads(args.speculative_config) if args.speculative_config else None,
        tuple(w for w in args.workloads.split(",") if w),
        conc,
        new_tokens,
        repeats=args.repeats,
        device=args.device,
        out_dir=args.out_dir,
    )
    return 0


def _connector_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("recipe", "train", "eval"),
        help="recipe: build the offline default from nothing (pretrain a ViT on "
        "generated images, train its projector, evaluate); train: train a "
        "projector for a timm encoder on --data; eval: held-out caption accuracy",
    )
    parser.add_argument("--out", help="connector directory to write (recipe, train) or read (eval)")
    parser.add_argument("--lm", default=None, help="the frozen LM; default " + DEFAULT_MODEL)
    parser.add_argument("--device", default="auto", help=HELP["device"])
    parser.add_argument(
        "--preset",
        default="cpu",
        choices=("cpu", "gpu", "tiny"),
        help="recipe: cpu (a small machine, hours) or gpu (one H100, minutes)",
    )
    parser.add_argument(
        "--encoder-weights",
        default=None,
        help="recipe: use this pretrained encoder file, skip pretraining",
    )
    parser.add_argument(
        "--encoder", default=None, help="train: timm model name (weights from --encoder-file)"
    )
    parser.add_argument("--encoder-file", default=None, help="train: local encoder weights")
    parser.add_argument("--encoder-kwargs", default="{}", help="train: JSON for create_model")
    parser.add_argument(
        "--projector", default="mlp2x_gelu", help="train: mlp2x_gelu | shuffle_linear | shuffle_mlp"
    )
    parser.add_argument("--scale", type=int, default=1, help="train: pixel-shuffle factor")
    parser.add_argument(
        "--data",
        default="synthetic:8000",
        help="train: synthetic:N or a JSONL manifest of {image, caption}",
    )
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--images", type=int, default=200, help="eval: held-out images")
    parser.add_argument(
        "--work-dir",
        default=None,
        help="recipe, train: checkpoint and feature cache (default: --out)",
    )


@subcommand("connector", "build, train or evaluate a vision connector", _connector_flags)
def connector(args: argparse.Namespace) -> int:
    import json

    if not args.out:
        print("mmserve: error: --out DIR is required", file=sys.stderr)
        return 2
    if args.action == "recipe":
        from connectors.recipe import run_recipe

        report = run_recipe(
            args.out,
            args.preset,
            args.lm,
            args.device,
            args.encoder_weights,
            args.images,
            work_dir=args.work_dir,
        )
    elif args.action == "eval":
        from connectors.evaluate import evaluate_connector

        report = evaluate_connector(args.out, args.lm, args.images, args.device)
    else:
        from connectors.train_cli import train_connector

        if not args.encoder:
            print("mmserve: error: train needs --encoder NAME", file=sys.stderr)
            return 2
        report = train_connector(
            args.out,
            args.encoder,
            args.encoder_file,
            json.loads(args.encoder_kwargs),
            args.projector,
            args.scale,
            args.data,
            args.lm,
            args.device,
            args.steps,
            args.batch_size,
            args.lr,
            args.save_every,
            args.work_dir,
        )
    print(json.dumps(report, indent=2))
    return 0


def _caption_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a directory of images or a JSONL manifest of {image}")
    parser.add_argument("--out", required=True, help="captions JSONL (appended; resumable)")
    parser.add_argument("--concurrency", type=int, default=32, help="images in flight")
    parser.add_argument(
        "--prompt", default=None, help="the instruction; default: the connector's own"
    )
    parser.add_argument("--max-tokens", type=int, default=48)


@subcommand(
    "caption",
    "caption a folder or manifest of images into a JSONL file",
    engine_flags,
    _caption_flags,
)
def caption(args: argparse.Namespace) -> int:
    from connectors.caption_job import caption_all, list_images
    from mmserve.engine.async_engine import AsyncEngine

    try:
        items = list_images(args.source)  # a bad manifest fails before the model loads
    except (OSError, UnicodeDecodeError, ValueError) as err:
        print(f"mmserve: error: {err}", file=sys.stderr)
        return 2
    engine = AsyncEngine.from_config(config_from(EngineConfig, args))
    try:
        if engine.image_processor is None:
            print(
                "mmserve: error: no vision connector is served; pass --connector DIR",
                file=sys.stderr,
            )
            return 2
        text = args.prompt or getattr(
            engine.engine.connector.config, "prompt", "Describe the image."
        )
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
        from pathlib import Path

        result = asyncio.run(
            caption_all(engine, items, Path(args.out), args.concurrency, text, params)
        )
        print(
            f"mmserve: captioned {result.done} images ({result.failed} failed, "
            f"{result.skipped} already done) in {result.seconds:.1f}s -> {args.out}"
        )
    finally:
        engine.shutdown_sync()
    return 0


def _ngram_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("build",), help="build a table from a corpus")
    parser.add_argument("corpus", help='JSONL file, one {"text": ...} object per line')
    parser.add_argument("table", help="output table file (memory-mapped at serve time)")
    parser.add_argument("--model", default=None, help="model whose tokenizer to use")
    parser.add_argument("--n", type=int, default=3, help="context length of the n-grams")
    parser.add_argument("--max-continuation", type=int, default=8)
    parser.add_argument("--min-count", type=int, default=2)


@subcommand("ngram", "build a global n-gram table for speculative decoding", _ngram_flags)
def ngram(args: argparse.Namespace) -> int:
    from mmserve.models.hub import resolve_model
    from mmserve.models.tokenizer import Tokenizer
    from mmserve.speculative.ngram_build import build_table_from_jsonl

    tok = Tokenizer(resolve_model(args.model))
    stats = build_table_from_jsonl(
        args.corpus,
        tok.encode,
        args.table,
        n=args.n,
        max_continuation=args.max_continuation,
        min_count=args.min_count,
    )
    print(f"wrote {args.table}: {stats}")
    return 0


def _register_speech() -> None:
    from mmserve import cli_speech  # noqa: F401 - registers say, voices, voice


def build_parser() -> argparse.ArgumentParser:
    _register_speech()
    parser = argparse.ArgumentParser(prog="mmserve", description="mmserve: LLM serving")
    parser.add_argument("--version", action="version", version=f"mmserve {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in SUBCOMMANDS.values():
        sub = subparsers.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        for configure in cmd.configure:
            configure(sub)
        sub.set_defaults(_run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Run = args._run
    del args._run, args.command
    try:
        return run(args)
    except ValueError as exc:  # a config value the dataclasses refused
        print(f"mmserve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # run as the package module, so plug-in subcommands register there
    from mmserve.cli import main as package_main

    sys.exit(package_main())
