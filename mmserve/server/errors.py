"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Every error a client can cause leaves the server through :func:`error_response`
(HTTP) or :func:`error_payload` (WebSocket ``error`` events), so both surfaces
speak the same shape. FastAPI's default 422 validation answer is replaced by an
OpenAI-style 400 that names the offending parameter.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from mmserve.errors import InvalidRequestError, MMServeError

log = logging.getLogger(__name__)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}

_CODE_BY_STATUS = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer was ready; nobody reads the reply."""


class ParamError(InvalidRequestError):
    """An invalid request that names the parameter at fault."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


def error_payload(
    message: str, status: int = 400, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error body (also the ``error`` field of a Realtime ``error`` event)."""
    fallback = "server_error" if status >= 500 else "invalid_request_error"
    err_type = _TYPE_BY_STATUS.get(status, fallback)
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(
    message: str,
    status: int = 400,
    param: str | None = None,
    code: str | None = None,
    retry_after_s: int = 1,
) -> JSONResponse:
    """The error as a response; a 429 says when to come back (``Retry-After``, seconds)."""
    headers = {"Retry-After": str(retry_after_s)} if status == 429 else None
    return JSONResponse(
        error_payload(message, status, param, code), status_code=status, headers=headers
    )


def _retry_after(request: Request) -> int:
    state = getattr(request.app.state, "mm", None)
    return int(state.config.retry_after_s) if state is not None else 1


def _response(request: Request, body: dict[str, Any], status: int) -> JSONResponse:
    err = body["error"]
    return error_response(err["message"], status, err["param"], err["code"], _retry_after(request))


def from_exception(exc: BaseException) -> tuple[dict[str, Any], int]:
    """Map any exception to (OpenAI error body, HTTP status); unknown ones are a 500."""
    if isinstance(exc, MMServeError):
        param = getattr(exc, "param", None)
        return error_payload(str(exc), exc.status, param, exc.code), exc.status
    if isinstance(exc, ValueError):  # SamplingParams and friends validate with ValueError
        return error_payload(str(exc), 400, None, "invalid_request_error"), 400
    log.exception("internal error", exc_info=exc)
    return error_payload(f"internal server error: {type(exc).__name__}", 500), 500


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or None


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": "value_error"}
    if first.get("type") == "json_invalid":
        return error_response("request body is not valid JSON", 400, None, "invalid_json")
    param = _loc_to_param(tuple(first.get("loc", ())))
    msg = str(first.get("msg", "")).removeprefix("Value error, ")
    message = f"{param}: {msg}" if param else msg
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem(s))"
    return error_response(message, 400, param, "invalid_request_error")


async def _on_mmserve_error(request: Request, exc: Exception) -> JSONResponse:
    body, status = from_exception(exc)
    return _response(request, body, status)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc.__cause__, RecursionError):  # json.loads gave up: nested ~1,000 deep
        return error_response(
            "the request JSON is nested too deeply (the server's limit is max_json_depth levels)",
            400,
            None,
            "json_too_deep",
        )
    code = _CODE_BY_STATUS.get(exc.status_code)
    return error_response(str(exc.detail), exc.status_code, None, code)


async def _on_disconnect(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # nginx's "client closed request"; never delivered


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    body, status = from_exception(exc)
    return _response(request, body, status)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error path of ``app`` to the OpenAI error shape."""
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(MMServeError, _on_mmserve_error)
    app.add_exception_handler(ValueError, _on_mmserve_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(ClientDisconnected, _on_disconnect)
    app.add_exception_handler(Exception, _on_unexpected)
