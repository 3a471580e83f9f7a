"""Untrusted image input: every refusal class, caps checked before decoding, and the
pixel conversions (EXIF orientation, transparency, palette, CMYK, 16-bit) against
the pixels PIL itself gives."""

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from connectors.base import ImageTokens, PreparedImage
from connectors.image_source import (
    ImageError,
    ImageErrorKind,
    ImageLimits,
    data_url_bytes,
    load_image,
)
from connectors.prompt import IMAGE_MARKER, splice_images

LIMITS = ImageLimits(max_bytes=200_000, max_pixels=512 * 512, max_images=2)


def _encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _rgb(w: int = 40, h: int = 30) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def _kind(fn, *args) -> ImageErrorKind:
    with pytest.raises(ImageError) as info:
        fn(*args)
    assert "allowed" in str(info.value) or "send" in str(info.value) or "must" in str(info.value)
    return info.value.kind


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_bomb(w: int, h: int) -> bytes:
    """A small PNG that claims w x h pixels (a decompression bomb's shape): refused from
    its header, never decoded."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 4096, 9)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
    )


def test_every_bad_image_class():
    png = _encode(_rgb())
    assert _kind(load_image, b"not an image at all", LIMITS) is ImageErrorKind.CORRUPT
    assert _kind(load_image, png[: len(png) // 2], LIMITS) is ImageErrorKind.TRUNCATED
    jpg = _encode(_rgb(), "JPEG")
    assert _kind(load_image, jpg[: len(jpg) // 2], LIMITS) is ImageErrorKind.TRUNCATED
    for side in (60_000, 5_000):  # over PIL's own bomb limit, and over only ours
        assert _kind(load_image, _png_bomb(side, side), LIMITS) is ImageErrorKind.TOO_LARGE
    assert _kind(load_image, _encode(_rgb(600, 600)), LIMITS) is ImageErrorKind.TOO_LARGE
    assert _kind(load_image, b"\0" * 300_000, LIMITS) is ImageErrorKind.TOO_LARGE
    tiff = _encode(_rgb(), "TIFF")
    assert _kind(load_image, tiff, LIMITS) is ImageErrorKind.UNSUPPORTED
    assert _kind(LIMITS.check_count, 3) is ImageErrorKind.TOO_MANY
    LIMITS.check_count(2)


def test_data_urls():
    png = _encode(_rgb())
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    assert data_url_bytes(url, LIMITS) == png
    assert (
        _kind(data_url_bytes, "data:image/tiff;base64,AAAA", LIMITS) is ImageErrorKind.UNSUPPORTED
    )
    assert _kind(data_url_bytes, "data:image/png;base64,@@@", LIMITS) is ImageErrorKind.CORRUPT
    big = "data:image/png;base64," + "A" * 400_000
    assert _kind(data_url_bytes, big, LIMITS) is ImageErrorKind.TOO_LARGE


def test_exif_orientation_turns_the_image_upright():
    src = _rgb(40, 30)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    out = load_image(_encode(src, "PNG", exif=exif), LIMITS)
    assert out.size == (30, 40)
    assert np.array_equal(np.asarray(out), np.asarray(src.transpose(Image.Transpose.ROTATE_270)))


def test_modes_become_rgb():
    rgba = Image.new("RGBA", (8, 8), (255, 0, 0, 0))
    rgba.putpixel((0, 0), (0, 0, 255, 255))
    out = np.asarray(load_image(_encode(rgba), LIMITS))
    assert tuple(out[0, 0]) == (0, 0, 255) and tuple(out[5, 5]) == (255, 255, 255)
    la = Image.new("LA", (4, 4), (10, 0))
    assert tuple(np.asarray(load_image(_encode(la), LIMITS))[0, 0]) == (255, 255, 255)
    pal = _rgb().convert("P")
    assert np.array_equal(
        np.asarray(load_image(_encode(pal), LIMITS)), np.asarray(pal.convert("RGB"))
    )
    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # red
    out = np.asarray(load_image(_encode(cmyk, "JPEG", quality=100), LIMITS))
    assert out.shape == (8, 8, 3) and out[4, 4, 0] > 200 and out[4, 4, 1] < 50
    grey16 = Image.fromarray(np.full((4, 4), 65535, dtype=np.uint16))
    out = np.asarray(load_image(_encode(grey16), LIMITS))
    assert out.shape == (4, 4, 3) and int(out.min()) == 255


def test_image_tokens_and_spans_agree():
    tokens = ImageTokens(
        (7, 9, 9, 8, 9, 9, 9, 7), (False, True, True, False, True, True, True, False)
    )
    assert tokens.runs() == [(1, 2), (4, 3)] and tokens.num_embeddings == 5
    import torch

    img = PreparedImage(torch.arange(6.0), tokens)
    prompt = splice_images(f"ab{IMAGE_MARKER}cd", [img], lambda s: [ord(c) for c in s])
    assert prompt.ids == [97, 98, 7, 9, 9, 8, 9, 9, 9, 7, 99, 100]
    assert [(s.start, s.length, s.offset) for s in prompt.spans] == [(3, 2, 0), (6, 3, 2)]
    assert all(s.pending and s.source == img.digest for s in prompt.spans)
    assert prompt.spans[0].digest != prompt.spans[1].digest
    with pytest.raises(ImageError):
        splice_images(f"{IMAGE_MARKER}{IMAGE_MARKER}", [img], lambda s: [1])
