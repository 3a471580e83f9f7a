"""Teacher data for the default voice: espeak-ng speech, its phonemes and their timing.

For each sentence: espeak's 22,050 Hz audio resampled to the codec's 24 kHz, the phoneme
symbols the voice reads (``tts.text.phoneme_symbols``) and each phoneme's start sample at
24 kHz. Stored in a directory as one int16 file of all the audio (``audio.i16``) and an
index (``index.json``); built once and reused (a marker is written last).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tts.espeak import SAMPLE_RATE as ESPEAK_RATE
from tts.espeak import Espeak
from tts.text import phoneme_symbols

RATE = 24000


@dataclass
class Item:
    text: str
    offset: int  # into audio.i16, in samples
    length: int
    symbols: list[str]
    is_phoneme: list[bool]
    starts: list[int]  # each phoneme's start sample at 24 kHz


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Band-limited resampling of a whole signal (FFT zero-padding / truncation)."""
    n_out = int(round(len(x) * dst / src))
    if len(x) == 0:
        return np.zeros(0, np.float32)
    spec = np.fft.rfft(x.astype(np.float64))
    return (np.fft.irfft(spec, n_out) * (n_out / len(x))).astype(np.float32)


def speak(text: str) -> tuple[np.ndarray, Item]:
    """espeak's rendering of ``text`` at 24 kHz (float32) and its item (offset 0)."""
    audio, events = Espeak.get().synthesize(text)
    ph = phoneme_symbols(text, events, len(audio))
    wav = resample(audio / 32768.0, ESPEAK_RATE, RATE)
    starts = [int(round(s * RATE / ESPEAK_RATE)) for s in ph.starts]
    return wav, Item(text, 0, len(wav), ph.symbols, ph.is_phoneme, starts)


def build(texts: list[str], out: Path, log_every: int = 500, workers: int = 1) -> None:
    """Render every text into ``out`` (skipped if ``out`` is already complete), in
    ``workers`` processes (0: one a CPU). espeak-ng carries a little state from one
    utterance to the next in a process, so phoneme timings can differ by a few ms with
    the number of workers; the sentences and their order do not."""
    if (out / "done").is_file():
        return
    out.mkdir(parents=True, exist_ok=True)
    workers = workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    items: list[Item] = []
    offset = 0
    with open(out / "audio.i16", "wb") as fh, _rendered(texts, workers) as rendered:
        for i, (pcm, item) in enumerate(rendered):
            fh.write(pcm.tobytes())
            item.offset = offset
            offset += len(pcm)
            items.append(item)
            if log_every and (i + 1) % log_every == 0:
                print(
                    f"teacher: {i + 1}/{len(texts)} sentences, {offset / RATE / 3600:.2f} h"
                    f" ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    (out / "index.json").write_text(json.dumps([asdict(it) for it in items]))
    (out / "done").write_text(str(len(items)))


def _render(text: str) -> tuple[np.ndarray, Item]:
    wav, item = speak(text)
    return np.clip(np.round(wav * 32767), -32768, 32767).astype(np.int16), item


@contextmanager
def _rendered(texts: list[str], workers: int) -> Iterator[Iterator[tuple[np.ndarray, Item]]]:
    """``_render`` of each text, in order. Worker processes are forked (espeak-ng is a
    per-process singleton, so each one loads its own) and fed chunks of sentences."""
    if workers <= 1:
        yield map(_render, texts)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        yield pool.imap(_render, texts, chunksize=16)


class Teacher:
    """A built teacher directory, read back (audio memory-mapped)."""

    def __init__(self, path: Path) -> None:
        if not (path / "done").is_file():
            raise FileNotFoundError(f"{path} holds no finished teacher data")
        self.items = [Item(**d) for d in json.loads((path / "index.json").read_text())]
        self.audio = np.memmap(path / "audio.i16", dtype=np.int16, mode="r")

    def __len__(self) -> int:
        return len(self.items)

    def wav(self, i: int) -> np.ndarray:
        it = self.items[i]
        return self.audio[it.offset : it.offset + it.length].astype(np.float32) / 32768.0
