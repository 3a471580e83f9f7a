"""Untrusted image bytes -> a validated RGB ``PIL.Image``.

Everything a client can send goes through ``load_image``: raw bytes, a ``data:``
URL, or a file path (callers decide whether paths are allowed at all). The byte
size is checked before anything is parsed, and the format and pixel count are read
from the header before a single pixel is decoded, so a decompression bomb (a small
file that claims 50,000 x 50,000 pixels) is refused for the cost of its header.
Then the image is decoded in full (a truncated file fails here, not later), turned
upright by its EXIF orientation, and made RGB: transparency (RGBA, LA, palette with
a transparent colour) is laid over white, CMYK and 16-bit greyscale are converted.

Every refusal is an ``ImageError`` whose ``kind`` names the class of problem and
whose message says what is allowed, so a server can answer 400 with it verbatim.
"""

from __future__ import annotations

import base64
import binascii
import enum
import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

MIME_FORMATS = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/jpg": "JPEG",
    "image/webp": "WEBP",
    "image/gif": "GIF",
    "image/bmp": "BMP",
    "image/tiff": "TIFF",
}
_DATA_URL = re.compile(
    r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)"
    r"(?P<b64>;base64)?,",
    re.ASCII,
)


class ImageErrorKind(enum.Enum):
    CORRUPT = "corrupt"  # not an image, or its data does not decode
    TRUNCATED = "truncated"  # the file ends before its pixels do
    TOO_LARGE = "too_large"  # over the byte or pixel cap
    UNSUPPORTED = "unsupported"  # a format or URL scheme that is not allowed
    TOO_MANY = "too_many"  # more images in one request than allowed


class ImageError(ValueError):
    """An image a client sent cannot be used; the message says what is allowed."""

    def __init__(self, kind: ImageErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class ImageLimits:
    """Caps on one image (and on images per request), enforced before decoding."""

    max_bytes: int = 20 * 1024 * 1024  # encoded size
    max_pixels: int = 40_000_000  # width x height as the header states it
    max_images: int = 8  # per request
    formats: tuple[str, ...] = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # PIL format names

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_pixels", "max_images"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def check_count(self, n: int) -> None:
        if n > self.max_images:
            raise ImageError(
                ImageErrorKind.TOO_MANY,
                f"{n} images in one request; at most {self.max_images} are allowed",
            )

    def allowed(self) -> str:
        return ", ".join(self.formats)


def data_url_bytes(url: str, limits: ImageLimits) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL, its size checked before decoding."""
    m = _DATA_URL.match(url)
    if m is None:
        raise ImageError(
            ImageErrorKind.CORRUPT, "a data URL must look like 'data:image/png;base64,<data>'"
        )
    mime = (m.group("mime") or "").lower()
    if mime not in MIME_FORMATS or MIME_FORMATS[mime] not in limits.formats:
        allowed = ", ".join(k for k, v in MIME_FORMATS.items() if v in limits.formats)
        raise ImageError(
            ImageErrorKind.UNSUPPORTED,
            f"image type {mime or 'missing'!r} is not supported; allowed: {allowed}",
        )
    body = url[m.end() :]
    if not m.group("b64"):
        raise ImageError(ImageErrorKind.CORRUPT, "image data URLs must be base64 (';base64,')")
    if len(body) * 3 // 4 > limits.max_bytes + 3:
        raise _too_many_bytes(len(body) * 3 // 4, limits)
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(
            ImageErrorKind.CORRUPT, f"the data URL is not valid base64: {exc}"
        ) from exc


def file_bytes(path: str | Path, limits: ImageLimits) -> bytes:
    """A local file's bytes, its size checked before it is read."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ImageError(
            ImageErrorKind.CORRUPT, f"cannot read image file {str(p)!r}: {exc.strerror or exc}"
        ) from exc
    if size > limits.max_bytes:
        raise _too_many_bytes(size, limits)
    return p.read_bytes()


def load_image(data: bytes, limits: ImageLimits) -> Image.Image:
    """Validated, decoded, upright RGB image from encoded bytes (see the module doc)."""
    if len(data) > limits.max_bytes:
        raise _too_many_bytes(len(data), limits)
    img = _open_header(data, limits)
    _decode(img)
    return to_rgb(ImageOps.exif_transpose(img) or img)


def _open_header(data: bytes, limits: ImageLimits) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=None)  # parses the header only
    except (
        UnidentifiedImageError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
        OSError,
        SyntaxError,
        ValueError,
    ) as exc:
        if isinstance(exc, Image.DecompressionBombError | Image.DecompressionBombWarning):
            raise ImageError(
                ImageErrorKind.TOO_LARGE,
                f"the image has too many pixels; at most {limits.max_pixels:,} are allowed",
            ) from exc
        raise ImageError(
            ImageErrorKind.CORRUPT,
            f"the data is not a readable image; send one of {limits.allowed()}",
        ) from exc
    if img.format not in limits.formats:
        raise ImageError(
            ImageErrorKind.UNSUPPORTED,
            f"image format {img.format} is not supported; allowed: {limits.allowed()}",
        )
    w, h = img.size
    if w < 1 or h < 1:
        raise ImageError(ImageErrorKind.CORRUPT, f"the image claims a size of {w}x{h}")
    if w * h > limits.max_pixels:
        raise ImageError(
            ImageErrorKind.TOO_LARGE,
            f"the image is {w}x{h} = {w * h:,} pixels; at most {limits.max_pixels:,} are allowed",
        )
    return img


def _decode(img: Image.Image) -> None:
    ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is an error, never half an image
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # size checked above
            img.load()
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        text = str(exc)
        kind = (
            ImageErrorKind.TRUNCATED
            if "truncated" in text or isinstance(exc, EOFError)
            else ImageErrorKind.CORRUPT
        )
        what = (
            "ends before its pixels do (truncated)"
            if kind is ImageErrorKind.TRUNCATED
            else f"does not decode ({text})"
        )
        raise ImageError(kind, f"the {img.format} image {what}; send a complete image") from exc


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB; transparent pixels become white."""
    if img.mode == "RGB":
        return img
    if img.mode == "P" and "transparency" in img.info or img.mode in ("RGBA", "LA", "PA", "RGBa"):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        arr = np.asarray(img).astype(np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        grey = np.clip(arr * (255.0 / top), 0, 255).round().astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    return img.convert("RGB")  # 1, L, P, CMYK, YCbCr, LAB, HSV


def _too_many_bytes(n: int, limits: ImageLimits) -> ImageError:
    return ImageError(
        ImageErrorKind.TOO_LARGE,
        f"the image is {n:,} bytes; at most {limits.max_bytes:,} are allowed",
    )
