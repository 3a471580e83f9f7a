"""espeak-ng through ctypes, from the ``espeakng-loader`` wheel (library + data, no system
package): speech for the default voice's teacher data, and phonemes for its text frontend.

``Espeak.synthesize(text)`` returns the 22,050 Hz samples and the phoneme events espeak
reports while speaking (name with stress marks, start sample, text position, word starts).
The default voice's frontend runs the same call and keeps only the events, so the phonemes
it feeds the voice at run time are exactly those it was trained on (espeak synthesizes
about 1,000x faster than real time, so this costs a few ms a sentence). espeak keeps
global state, so one process-wide lock serializes calls.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 22050
_SYNCHRONOUS = 2  # AUDIO_OUTPUT_SYNCHRONOUS
_PHONEME_EVENTS = 0x0001  # espeakINITIALIZE_PHONEME_EVENTS
_DONT_EXIT = 0x8000
_EV_LIST_END, _EV_WORD, _EV_PHONEME = 0, 1, 7
_POS_CHARACTER, _CHARS_UTF8 = 1, 1
_CONTROL_TO_SPACE = {c: " " for c in (*range(0x20), 0x7F) if chr(c) not in "\t\n\r"}


class _Event(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


@dataclass(frozen=True)
class Phoneme:
    """One phoneme espeak spoke: ``name`` (its mnemonic, stress marks included; ``_`` and
    ``_:`` are pauses), where it starts (sample at 22,050 Hz), the 1-based character
    position in the text it came from, and whether it starts a word."""

    name: str
    sample: int
    text_position: int
    word_start: bool


class EspeakError(RuntimeError):
    """espeak-ng could not be loaded or refused the request."""


class Espeak:
    _lock = threading.Lock()
    _instance: Espeak | None = None

    def __init__(self, voice: str = "en-us") -> None:
        try:
            import espeakng_loader
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise EspeakError("the espeakng-loader package is not installed") from exc
        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        rate = self.lib.espeak_Initialize(
            _SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), _PHONEME_EVENTS | _DONT_EXIT
        )
        if rate != SAMPLE_RATE:
            raise EspeakError(f"espeak-ng initialised at {rate} Hz, expected {SAMPLE_RATE}")
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise EspeakError(f"espeak-ng has no voice {voice!r}")
        self._chunks: list[np.ndarray] = []
        self._events: list[Phoneme] = []
        self._word = False
        self._callback = _CALLBACK(self._on_audio)  # kept alive as long as self
        self.lib.espeak_SetSynthCallback(self._callback)

    @classmethod
    def get(cls) -> Espeak:
        """The process-wide instance (espeak-ng is a singleton library)."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def synthesize(self, text: str) -> tuple[np.ndarray, list[Phoneme]]:
        """-> (int16 samples at 22,050 Hz, the phonemes spoken)."""
        # control characters read as spaces, one for one (event positions index ``text``):
        # espeak takes a C string, so a NUL would end the text there
        data = text.translate(_CONTROL_TO_SPACE).encode("utf-8")
        with self._lock:
            self._chunks, self._events, self._word = [], [], False
            err = self.lib.espeak_Synth(
                ctypes.c_char_p(data), len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
            )
            if err != 0:
                raise EspeakError(f"espeak_Synth failed with code {err}")
            self.lib.espeak_Synchronize()
            audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
            return audio, list(self._events)

    def _on_audio(self, wav, n: int, events) -> int:
        if n > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        i = 0
        while events[i].type != _EV_LIST_END:
            ev = events[i]
            if ev.type == _EV_WORD:
                self._word = True
            elif ev.type == _EV_PHONEME:
                name = ev.id.decode("utf-8", errors="replace")
                self._events.append(Phoneme(name, ev.sample, ev.text_position, self._word))
                self._word = False
            i += 1
        return 0
