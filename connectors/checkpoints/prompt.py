"""A chat with images -> prompt ids and where each image's embeddings go.

The same steps as an HF processor: render the chat template (image parts become the
template's image marker), replace the i-th marker by the i-th image's placeholder text
(``connector.placeholder``), tokenize the whole string with special tokens as
``processor(text=..., images=...)`` does, then find the runs of image-token ids. Image i
owns the next ``connector.num_tokens(frames_i)`` placeholder ids, in order; a run is a
contiguous stretch of them (Idefics3 has one per tile), so the runs are exactly the
``EmbeddingSpan``s of its rows ``offset .. offset + length``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mmserve.errors import InvalidRequestError

IMAGE_PART_TYPES = ("image", "image_url")


class ImageLayout(Protocol):
    image_token: str
    image_token_id: int

    def num_tokens(self, frames: Any) -> int: ...

    def placeholder(self, frames: Any) -> str: ...


class TextCodec(Protocol):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...


@dataclass(frozen=True)
class Run:
    """Prompt positions ``start .. start + length`` take rows ``offset ..`` of image
    ``image``'s embeddings."""

    start: int
    image: int
    offset: int
    length: int


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages -> what HF chat templates read: every ``image_url`` part becomes
    ``{"type": "image"}`` (the image itself travels apart, in order of appearance)."""
    out = []
    for message in messages:
        msg = copy.deepcopy(dict(message))
        if isinstance(msg.get("content"), list):
            msg["content"] = [{"type": "image"} if isinstance(p, Mapping) and
                              p.get("type") in IMAGE_PART_TYPES else p for p in msg["content"]]
        out.append(msg)
    return out


def expand_images(text: str, frames: Sequence[Any], layout: ImageLayout) -> str:
    """``text`` with its i-th image marker replaced by image i's placeholder text."""
    pieces = text.split(layout.image_token)
    if len(pieces) - 1 != len(frames):
        raise InvalidRequestError(
            f"the prompt has {len(pieces) - 1} image markers ({layout.image_token!r}) for "
            f"{len(frames)} images; write each image as an image part, not as text")
    out = [pieces[0]]
    for piece, f in zip(pieces[1:], frames, strict=True):
        out += [layout.placeholder(f), piece]
    return "".join(out)


def image_runs(ids: Sequence[int], frames: Sequence[Any], layout: ImageLayout) -> list[Run]:
    """The runs of image-token ids in ``ids``, assigned to the images in order."""
    need = [layout.num_tokens(f) for f in frames]
    positions = [i for i, t in enumerate(ids) if t == layout.image_token_id]
    if len(positions) != sum(need):
        raise InvalidRequestError(
            f"the prompt holds {len(positions)} image placeholder tokens where its {len(need)} "
            f"images need {sum(need)}; the text must not contain {layout.image_token!r} itself")
    runs: list[Run] = []
    first = 0
    for image, n in enumerate(need):
        for offset, pos in enumerate(positions[first:first + n]):
            last = runs[-1] if runs else None
            if last is not None and last.image == image and last.start + last.length == pos:
                runs[-1] = Run(last.start, image, last.offset, last.length + 1)
            else:
                runs.append(Run(pos, image, offset, 1))
        first += n
    return runs


def image_prompt(tokenizer: TextCodec, text: str, frames: Sequence[Any],
                 layout: ImageLayout) -> tuple[list[int], list[Run]]:
    """A rendered prompt with image markers -> (ids, runs), as the HF processor tokenizes."""
    ids = tokenizer.encode(expand_images(text, frames, layout), add_special_tokens=True)
    return ids, image_runs(ids, frames, layout)
