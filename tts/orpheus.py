"""Orpheus-style voices: a Llama-3 backbone whose vocabulary holds SNAC codes, and SNAC 24 kHz.

The family's conventions (canopylabs ``orpheus_tts``): the Llama-3 vocabulary (128,256
ids) is followed by ``<custom_token_N>`` = id ``128256 + N``; the prompt is
``[start_of_human 128259] + tokenizer("{speaker}: {text}") (with <|begin_of_text|>) +
[<|eot_id|> 128009, end_of_human 128260, start_of_ai 128261, start_of_speech 128257]``;
the model answers with 7 tokens a SNAC frame from id 128266 (``tts.layout.OrpheusLayout``)
and ends with end_of_speech 128258. Sampling as the reference serves it: temperature 0.6,
top_p 0.8, up to 1,200 tokens. (The reference also applies a repetition penalty of 1.3,
which the engine's sampler does not have; its presence/frequency penalties are not the
same rule, so none is applied.)
"""

from __future__ import annotations

from pathlib import Path

import torch

from mmserve.sampling_params import SamplingParams
from tts.codec import StreamingCodec
from tts.layout import OrpheusLayout
from tts.text import split_clauses
from tts.voice import Voice

START_OF_HUMAN, END_OF_HUMAN, START_OF_AI = 128259, 128260, 128261
START_OF_SPEECH, END_OF_SPEECH, EOT = 128257, 128258, 128009
AUDIO_BASE = 128266
SPEAKERS = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")


class OrpheusVoice(Voice):
    layout = OrpheusLayout(AUDIO_BASE, 4096)
    max_piece_chars = 300  # Orpheus was trained on sentence-length utterances

    def __init__(self, path: Path, meta: dict, snac: str | Path | None = None) -> None:
        from mmserve.models.tokenizer import Tokenizer

        self.model_dir = path
        self.name = meta.get("name", path.name)
        self.speakers = tuple(meta.get("speakers", SPEAKERS))
        self.default_speaker = meta.get("default_speaker", self.speakers[0])
        self.snac_dir = Path(snac) if snac else path / meta.get("snac", "snac")
        self.tokenizer = Tokenizer(path)
        self.max_tokens = int(meta.get("max_tokens", 1200))
        self.temperature = float(meta.get("temperature", 0.6))
        self.top_p = float(meta.get("top_p", 0.8))

    def load_codec(self, device: torch.device | str = "cpu") -> StreamingCodec:
        from tts.snac import SNAC

        if not (self.snac_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"no SNAC decoder at {self.snac_dir} (config.json + "
                "pytorch_model.bin or model.safetensors)"
            )
        return SNAC.from_dir(self.snac_dir).to(device)

    def prompts(self, text: str, speaker: str | None = None) -> list[list[int]]:
        who = speaker if speaker in self.speakers else self.default_speaker
        return [self.prompt(piece, who) for piece in split_clauses(text, self.max_piece_chars)]

    def prompt(self, text: str, speaker: str | None) -> list[int]:
        words = f"{speaker}: {text}" if speaker else text
        ids = self.tokenizer.encode(words, add_special_tokens=True)
        return [START_OF_HUMAN, *ids, EOT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]

    def sampling(self, prompt: list[int], seed: int | None = None) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            stop_token_ids=[END_OF_SPEECH],
            seed=seed,
            detokenize=False,
        )
