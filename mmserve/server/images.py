"""Images in chat requests: ``image_url`` parts -> bytes -> validated images -> prepared.

``data:`` URLs are always accepted; ``http(s)`` URLs only with ``--allow-remote-images``
and local files (``file://`` or a plain path) only under ``--allowed-local-media-path``.
Every refusal is a 400 naming the part (``messages.I.content.J``) and saying what is
allowed; decoding and preprocessing run in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from connectors.base import ImageProcessor, PreparedImage
from connectors.image_source import (
    ImageError,
    ImageErrorKind,
    ImageLimits,
    data_url_bytes,
    file_bytes,
    load_image,
)
from mmserve.config import ServerConfig
from mmserve.server.errors import ParamError


@dataclass
class ImageRef:
    url: str
    param: str  # where it sits in the request, for error messages


def image_limits(config: ServerConfig) -> ImageLimits:
    formats = tuple(f.strip().upper() for f in config.image_formats.split(",") if f.strip())
    return ImageLimits(
        config.max_image_bytes, config.max_image_pixels, config.max_images_per_request, formats
    )


async def prepare_images(
    refs: list[ImageRef], config: ServerConfig, processor: ImageProcessor
) -> list[PreparedImage]:
    """Fetch, validate, decode and prepare every image of a request, in order."""
    limits = image_limits(config)
    try:
        limits.check_count(len(refs))
    except ImageError as exc:
        raise _param_error(exc, "messages") from exc
    raw = [await _fetch(ref, config, limits) for ref in refs]

    def work() -> list[PreparedImage]:
        out = []
        for ref, data in zip(refs, raw, strict=True):
            try:
                out.append(processor.prepare(load_image(data, limits)))
            except ImageError as exc:
                raise _param_error(exc, ref.param) from exc
        return out

    return await asyncio.to_thread(work)


async def _fetch(ref: ImageRef, config: ServerConfig, limits: ImageLimits) -> bytes:
    url = ref.url
    try:
        if url.startswith("data:"):
            return data_url_bytes(url, limits)
        scheme = urlparse(url).scheme.lower()
        if scheme in ("http", "https"):
            if not config.allow_remote_images:
                raise _scheme_refused(scheme, config)
            return await _download(url, config, limits)
        if scheme in ("file", "") and config.allowed_local_media_path:
            return _local(url, config, limits)
        raise _scheme_refused(scheme or "path", config)
    except ImageError as exc:
        raise _param_error(exc, ref.param) from exc


def _scheme_refused(scheme: str, config: ServerConfig) -> ImageError:
    allowed = ["data:image/...;base64 URLs"]
    if config.allow_remote_images:
        allowed.append("http(s) URLs")
    if config.allowed_local_media_path:
        allowed.append(f"files under {config.allowed_local_media_path}")
    return ImageError(
        ImageErrorKind.UNSUPPORTED,
        f"image URLs of kind {scheme!r} are not accepted by this server; "
        f"allowed: {', '.join(allowed)}",
    )


def _local(url: str, config: ServerConfig, limits: ImageLimits) -> bytes:
    root = Path(config.allowed_local_media_path or "").resolve()
    raw = unquote(urlparse(url).path) if url.startswith("file:") else url
    path = Path(raw).resolve()
    if not path.is_relative_to(root):
        raise ImageError(
            ImageErrorKind.UNSUPPORTED, f"local images must lie under {root}; {raw!r} does not"
        )
    return file_bytes(path, limits)


async def _download(url: str, config: ServerConfig, limits: ImageLimits) -> bytes:
    import httpx

    data = bytearray()
    try:
        async with httpx.AsyncClient(
            timeout=config.remote_image_timeout_s, follow_redirects=True
        ) as client:
            async with client.stream("GET", url) as resp:
                if resp.status_code != 200:
                    raise ImageError(
                        ImageErrorKind.CORRUPT,
                        f"fetching the image gave HTTP {resp.status_code}; send a "
                        f"reachable image URL or a data: URL",
                    )
                async for chunk in resp.aiter_bytes():
                    data += chunk
                    if len(data) > limits.max_bytes:
                        raise ImageError(
                            ImageErrorKind.TOO_LARGE,
                            f"the image is over {limits.max_bytes:,} bytes; at most "
                            f"{limits.max_bytes:,} are allowed",
                        )
    except httpx.HTTPError as exc:
        raise ImageError(
            ImageErrorKind.CORRUPT,
            f"the image URL could not be fetched ({exc}); send a reachable URL or a data: URL",
        ) from exc
    return bytes(data)


def _param_error(exc: ImageError, param: str) -> ParamError:
    return ParamError(str(exc), param=param, code=f"invalid_image_{exc.kind.value}")
