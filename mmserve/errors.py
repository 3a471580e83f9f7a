"""Errors a user can cause, each mapped by the server to an HTTP status."""

from __future__ import annotations


class MMServeError(Exception):
    """Base class; ``status`` is the HTTP status the server answers with."""

    status = 400
    code: str | None = None


class InvalidRequestError(MMServeError, ValueError):
    """The request itself is wrong (bad argument, prompt longer than the context, ...)."""

    status = 400
    code = "invalid_request_error"


class QueueFullError(MMServeError):
    """The waiting queue is at its bound; the client should retry later (HTTP 429)."""

    status = 429
    code = "rate_limit_exceeded"


class UnknownModelError(MMServeError, ValueError):
    """A model name that is neither a known name nor a local path."""

    status = 404
    code = "model_not_found"


class EngineDeadError(MMServeError):
    """The engine's loop has stopped; nothing can be served until a restart (HTTP 503)."""

    status = 503
    code = "engine_unavailable"
