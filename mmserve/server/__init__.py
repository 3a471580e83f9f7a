"""The HTTP and WebSocket surface of mmserve (OpenAI-compatible).

``create_app(engine, server_config)`` builds the FastAPI app around a running
engine; ``mmserve serve`` (``mmserve.cli``) runs it under uvicorn.
"""

from mmserve.server.app import create_app

__all__ = ["create_app"]
