"""The app factory: ``create_app(engine, server_config) -> FastAPI``.

The app does not own the engine: whoever made the engine (the CLI, a test)
shuts it down. Each app gets its own metrics registry, so several apps (say one
with an API key and one without) can share a process and even an engine.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from mmserve import __version__
from mmserve.config import ServerConfig
from mmserve.server.chat_output import resolve_formats
from mmserve.server.engine_client import EngineClient
from mmserve.server.errors import install_error_handlers
from mmserve.server.metrics import ServerMetrics
from mmserve.server.middleware import ServingMiddleware
from mmserve.server.protocol_out import ModelCard, ModelList
from mmserve.server.realtime import router as realtime_router
from mmserve.server.routes_chat import router as chat_router
from mmserve.server.routes_completions import router as completions_router
from mmserve.server.routes_demo import router as demo_router
from mmserve.server.routes_speech import router as speech_router
from mmserve.server.serving import ServerState, get_state
from mmserve.server.sse import RAW_SEND

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

basic_router = APIRouter()


class MMServeApp(FastAPI):
    """FastAPI that leaves the ASGI server's own send in the scope (``sse.RAW_SEND``), so a
    streamed body bypasses the middleware's per-message send wrappers."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[RAW_SEND] = send
        await super().__call__(scope, receive, send)


@basic_router.get("/health")
async def health(request: Request) -> Response:
    """200 while the engine loop runs; 503 when it has died or one step has run longer than
    ``engine_stall_timeout_s`` (stuck). Engines without these probes are taken as alive."""
    state = get_state(request)
    engine = state.engine
    alive = getattr(engine, "alive", None)
    if alive is not None and not alive():
        return JSONResponse({"status": "engine dead"}, status_code=503)
    step_seconds = getattr(engine, "step_seconds", None)
    stuck = step_seconds() if step_seconds is not None else 0.0
    if stuck > state.config.engine_stall_timeout_s:
        return JSONResponse(
            {"status": "engine stuck", "step_seconds": round(stuck, 1)}, status_code=503
        )
    return JSONResponse({"status": "ok"})


@basic_router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    state = get_state(request)
    return ModelList(
        data=[ModelCard(id=state.model_name, max_model_len=state.engine.max_model_len)]
    )


@basic_router.get("/v1/models/{model:path}")
async def retrieve_model(request: Request, model: str) -> ModelCard:
    """The served model's card (``client.models.retrieve``); 404 for any other name."""
    state = get_state(request)
    state.check_model(model)
    return ModelCard(id=state.model_name, max_model_len=state.engine.max_model_len)


@basic_router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = get_state(request)
    refresh = getattr(state.engine, "refresh", None)
    if refresh is not None:  # an engine in another process: fetch its counters now
        await refresh()
    return Response(state.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)


def _compile_chat_template(tokenizer: Any) -> None:
    """Render the chat template once, so its compile (cached per template; milliseconds)
    is paid at start-up, not in the first request's TTFT."""
    if getattr(tokenizer, "chat_template", None) is None:
        return  # a base model: chat requests get a 400 anyway
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    except Exception:  # noqa: BLE001 - a template that needs more fails its request instead
        pass


def create_app(
    engine: EngineClient,
    server_config: ServerConfig | None = None,
    speech: Any = None,
    max_speech_input_chars: int = 4096,
    metrics_dir: str | None = None,
) -> FastAPI:
    """Build the OpenAI-compatible app around a running engine (and, for
    ``/v1/audio/speech``, a ``tts.service.SpeechService``). ``metrics_dir``: this app is
    one of several API servers whose metrics sum there (``metrics.ServerMetrics``)."""
    config = server_config or ServerConfig()
    model_name = config.served_model_name or engine.model_name
    formats = resolve_formats(
        config.tool_call_parser,
        config.reasoning_parser,
        getattr(engine.tokenizer, "chat_template", None),
    )
    _compile_chat_template(engine.tokenizer)
    metrics_ = ServerMetrics(engine.stats, model_name, metrics_dir)
    if speech is not None:  # the voice engine's series (audio streams, refusals, KV)
        metrics_.add_engine(speech.engine.stats, speech.model_name)
    app = MMServeApp(title="mmserve", version=__version__, docs_url=None, redoc_url=None)
    app.state.mm = ServerState(engine, config, model_name, formats, metrics_)
    app.state.speech, app.state.speech_max_chars = speech, max_speech_input_chars
    install_error_handlers(app)
    for router in (
        basic_router,
        chat_router,
        completions_router,
        realtime_router,
        speech_router,
        demo_router,
    ):
        app.include_router(router)
    app.add_middleware(
        ServingMiddleware,
        api_key=config.api_key,
        max_body_bytes=config.max_body_bytes,
        metrics=metrics_,
    )
    return app
