"""An HF VLM checkpoint's processor as a ``connectors`` ``ImageProcessor``.

It does what the checkpoint's HF processor does, in its order, so a prompt reaches the
LM exactly as under transformers:

1. ``prepare``: the HF image processor's pixels (``preprocess``) and the text that stands
   for the image (the family's ``layout``: Idefics3 tiles, LLaVA's patch run), tokenized.
2. The chat template prints ``image_text`` (``"<image>"``) once per image part.
3. ``splice``: each marker is replaced by its image's text and the WHOLE string is
   tokenized with special tokens, as ``processor(text=..., images=...)`` does. Piecewise
   tokenization (``connectors.prompt.splice_images``) would lose the BOS a Llama
   tokenizer adds and the word-start marker a SentencePiece tokenizer puts only at the
   start of a text; the image's ids are then found by character offset and checked.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image

from connectors.base import ImageProcessor, ImageTokens, PreparedImage
from connectors.checkpoints.preprocess import Frames, SquareProcessor, TiledProcessor
from connectors.image_source import ImageError, ImageErrorKind
from connectors.prompt import ImagePrompt
from mmserve.models.tokenizer import Tokenizer

IMAGE_PART_TYPES = ("image", "image_url")


@dataclass
class CheckpointImage(PreparedImage):
    """A ``PreparedImage`` that keeps the text its ``tokens`` came from (for ``splice``)."""

    text: str = ""
    rows: int = 0  # the tile grid (0 x 0: one frame)
    cols: int = 0


class CheckpointProcessor(ImageProcessor):
    """Pixels, placeholder text and whole-prompt tokenization of one HF checkpoint."""

    def __init__(
        self,
        frames: TiledProcessor | SquareProcessor,
        layout: Callable[[Frames], str],
        image_text: str,
        image_token_id: int,
        tokenizer: Tokenizer,
    ) -> None:
        self.frames, self.layout, self.tokenizer = frames, layout, tokenizer
        self.image_text, self.image_token_id = image_text, image_token_id
        found = tokenizer.token_to_id(image_text)
        if found != image_token_id:
            raise ValueError(
                f"the tokenizer reads {image_text!r} as id {found}, but the model "
                f"config puts images at id {image_token_id}"
            )

    def prepare(self, image: Image.Image) -> CheckpointImage:
        frames = self.frames(image)
        text = self.layout(frames)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        tokens = ImageTokens(tuple(ids), tuple(i == self.image_token_id for i in ids))
        return CheckpointImage(frames.pixels, tokens, text=text, rows=frames.rows, cols=frames.cols)

    def splice(
        self,
        text: str,
        images: Sequence[PreparedImage],
        encode: Callable[[str], list[int]] | None = None,
    ) -> ImagePrompt:
        """``text`` with one ``image_text`` per image -> ids and pending spans, tokenized
        whole as the HF processor does (module docstring; ``encode`` is not used)."""
        pieces = text.split(self.image_text)
        if len(pieces) != len(images) + 1:
            raise ImageError(
                ImageErrorKind.CORRUPT,
                f"the prompt shows {len(pieces) - 1} image positions for "
                f"{len(images)} images; message text must not contain "
                f"{self.image_text!r}",
            )
        full, starts = pieces[0], []
        for img, piece in zip(images, pieces[1:], strict=True):
            assert isinstance(img, CheckpointImage), "images come from this processor"
            starts.append(len(full))
            full += img.text + piece
        enc = self.tokenizer.backend.encode(full, add_special_tokens=True)
        ids, spans = list(enc.ids), []
        for img, char in zip(images, starts, strict=True):
            start = enc.char_to_token(char)
            n = len(img.tokens.ids)
            if start is None or tuple(ids[start : start + n]) != img.tokens.ids:
                raise ValueError(
                    "the image's tokens change in context; this tokenizer merges "
                    "them with the text around them"
                )
            spans += img.spans(start)
        return ImagePrompt(ids, spans, sum(len(img.tokens.ids) for img in images))


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages -> what HF chat templates read: every ``image_url`` part becomes
    ``{"type": "image"}`` (the image itself travels apart, in order of appearance)."""
    out = []
    for message in messages:
        msg = copy.deepcopy(dict(message))
        if isinstance(msg.get("content"), list):
            msg["content"] = [
                {"type": "image"}
                if isinstance(p, Mapping) and p.get("type") in IMAGE_PART_TYPES
                else p
                for p in msg["content"]
            ]
        out.append(msg)
    return out
