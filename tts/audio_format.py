"""Audio bytes for clients: 16-bit PCM, WAV (streamable), FLAC.

A streamed WAV cannot know its length up front, so its header says 0xFFFFFFFF for both
sizes, as OpenAI's streamed WAV does; soundfile, ffmpeg and browsers read it to the end.
FLAC is encoded once the audio is complete (soundfile).
"""

from __future__ import annotations

import io
import struct

import numpy as np

FORMATS = ("wav", "pcm", "flac")
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}
_UNKNOWN = 0xFFFFFFFF


def pcm16(samples: np.ndarray) -> bytes:
    """float [-1, 1] -> little-endian signed 16-bit."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """A mono 16-bit PCM WAV header; ``data_bytes=None``: length unknown (streaming)."""
    data = _UNKNOWN if data_bytes is None else data_bytes
    riff = _UNKNOWN if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


def flac(samples: np.ndarray, sample_rate: int) -> bytes:
    import soundfile

    buf = io.BytesIO()
    soundfile.write(
        buf, np.asarray(samples, np.float32), sample_rate, format="FLAC", subtype="PCM_16"
    )
    return buf.getvalue()
