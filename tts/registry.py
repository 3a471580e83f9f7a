"""Voice names -> the voice that speaks them.

A server loads one voice backbone; its registry answers every name a client may send:
the voice's own name, ``default``, OpenAI's voice names (so unchanged clients work; they
all map to the loaded voice, which has one timbre) and, for a multi-speaker backbone
(Orpheus), its speaker names, each of which becomes the prompt's speaker. ``mmserve
voices`` prints this table.
"""

from __future__ import annotations

from pathlib import Path

from mmserve.errors import InvalidRequestError
from tts.voice import Voice, load_voice

OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "cedar",
    "coral",
    "echo",
    "fable",
    "marin",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)
DEFAULT_VOICE_DIR = Path(__file__).parent / "voices" / "default"


def voice_dir(name_or_path: str | None) -> Path:
    """``None``/``"default"``: the voice shipped in the package; else a directory."""
    if name_or_path in (None, "", "default"):
        if not (DEFAULT_VOICE_DIR / "voice.json").is_file():
            raise FileNotFoundError(
                f"the default voice is missing from {DEFAULT_VOICE_DIR}; "
                "rebuild it with `mmserve voice train`"
            )
        return DEFAULT_VOICE_DIR
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise ValueError(f"unknown voice {name_or_path!r}: give 'default' or a voice directory")
    return path


class UnknownVoiceError(InvalidRequestError):
    """A request named a voice this server does not have."""


class VoiceRegistry:
    def __init__(self, voice: Voice) -> None:
        self.voice = voice
        self._speaker: dict[str, str | None] = {n: None for n in OPENAI_VOICES}
        self._speaker |= {"default": None, voice.name: None}
        self._speaker |= {s: s for s in voice.speakers}

    def names(self) -> list[str]:
        return sorted(self._speaker)

    def resolve(self, name: str) -> str | None:
        """The speaker for voice ``name`` (None: the voice's default); a 400 if unknown."""
        key = name.lower()
        if key not in self._speaker:
            raise UnknownVoiceError(f"unknown voice {name!r}; allowed: {', '.join(self.names())}")
        return self._speaker[key]

    def table(self) -> list[tuple[str, str]]:
        """(name, what it speaks with) rows for ``mmserve voices``."""
        rows = []
        for n in self.names():
            who = self._speaker[n]
            rows.append((n, f"{self.voice.name}" + (f" (speaker {who})" if who else "")))
        return rows


def load(name_or_path: str | None = None, snac: str | None = None) -> Voice:
    return load_voice(voice_dir(name_or_path), snac)
