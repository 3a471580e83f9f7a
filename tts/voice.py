"""A codec-LM voice: a backbone the engine serves, a frame layout, a codec, a text frontend.

The engine serves the backbone like any model (its vocabulary holds the audio codes;
batching, paging, prefix caching and CUDA graphs apply); a voice only says how text becomes
prompt token ids (``prompts``: one per piece, split at clause boundaries, so a long input
streams piece by piece), how to sample (``sampling``), how the output tokens spell frames
(``layout``) and which codec turns frames into PCM (``load_codec``). ``load_voice`` reads
a voice directory: ``voice.json`` names its kind.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path

import torch

from mmserve.sampling_params import SamplingParams
from tts.codec import StreamingCodec
from tts.layout import FrameLayout


class Voice(ABC):
    name: str
    model_dir: Path  # the backbone: an HF-layout Llama directory the engine loads
    layout: FrameLayout
    speakers: tuple[str, ...] = ()  # speaker names the backbone knows (Orpheus: tara, ...)
    max_input_chars: int = 4096

    @abstractmethod
    def load_codec(self, device: torch.device | str = "cpu") -> StreamingCodec: ...

    @abstractmethod
    def prompts(self, text: str, speaker: str | None = None) -> list[list[int]]:
        """Prompt token ids for ``text``, one per piece to speak in order."""

    @abstractmethod
    def sampling(self, prompt: list[int], seed: int | None = None) -> SamplingParams:
        """How to sample one piece's frames (stop token, a max_tokens bound)."""

    def describe(self) -> dict:
        return {
            "name": self.name,
            "kind": type(self).__name__,
            "model": str(self.model_dir),
            "speakers": list(self.speakers),
            "frame_ms": None,
            "tokens_per_frame": self.layout.tokens_per_frame,
        }


def load_voice(path: str | Path, snac: str | Path | None = None) -> Voice:
    """The voice in directory ``path``: ``voice.json`` says its kind; an Orpheus checkpoint
    (a Llama whose vocabulary holds 7 x 4,096 audio codes) needs no voice.json, its SNAC
    decoder in ``path/snac`` or at ``snac``."""
    path = Path(path).expanduser()
    meta_file = path / "voice.json"
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    kind = meta.get("kind") or ("orpheus" if _looks_orpheus(path) else None)
    if kind == "phoneme-frame":
        from tts.phoneme_voice import PhonemeVoice

        return PhonemeVoice(path, meta)
    if kind == "orpheus":
        from tts.orpheus import OrpheusVoice

        return OrpheusVoice(path, meta, snac)
    raise ValueError(
        f"{path} is not a voice directory: it has no voice.json naming a kind "
        "(phoneme-frame, orpheus) and is not an Orpheus checkpoint"
    )


def _looks_orpheus(path: Path) -> bool:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        return False
    return int(json.loads(cfg_file.read_text()).get("vocab_size", 0)) >= 128266 + 7 * 4096
