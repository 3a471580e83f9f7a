"""The connector interfaces: what turns an image into prompt tokens and embeddings.

Two halves, split where processes split (the API server prepares, the engine encodes):

- ``ImageProcessor`` (CPU, config only, no weights): one validated RGB image ->
  ``PreparedImage``: pixel tensor(s) (tiles for large images) and the exact prompt
  tokens the image occupies (``ImageTokens``), decided by the same code that cut the
  tiles, so the placeholder count can never disagree with the embeddings.
- ``Connector`` (weights, the engine's device): a frozen encoder + projector. It is the
  engine's ``SpanEncoder``: ``encode`` takes many prepared pixel tensors at once (one
  engine step's images, batched) and returns one ``(n, hidden)`` tensor per image in
  the LM's input-embedding space, ``n == prepared.tokens.num_embeddings``.

The engine never sees images: ``PreparedImage.spans(start)`` turns an image placed at
prompt position ``start`` into pending ``EmbeddingSpan``s (pixel tensor, digests,
lengths: plain data), and the engine encodes them with the registered connector right
before the prefill chunk that reads them.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from PIL import Image

from mmserve.engine.request import EmbeddingSpan
from mmserve.engine.span_encoder import SpanEncoder

if TYPE_CHECKING:
    from connectors.prompt import ImagePrompt


@dataclass(frozen=True)
class ImageTokens:
    """The prompt ids one image occupies, in order, and which of them an embedding row
    replaces (``embedded``). Wrapper ids (row/column markers, image-start/end tokens)
    are ``False`` and keep their token embeddings; the ``True`` positions, read in
    order, take rows ``0 .. num_embeddings - 1`` of the image's encoding."""

    ids: tuple[int, ...]
    embedded: tuple[bool, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.embedded) or not any(self.embedded):
            raise ValueError("ImageTokens needs one flag per id and at least one embedded id")

    @classmethod
    def run(
        cls, placeholder_id: int, n: int, before: Sequence[int] = (), after: Sequence[int] = ()
    ) -> ImageTokens:
        """``before`` + ``n`` placeholders (all embedded) + ``after``."""
        ids = (*before, *([placeholder_id] * n), *after)
        flags = (False,) * len(before) + (True,) * n + (False,) * len(after)
        return cls(ids, flags)

    @property
    def num_embeddings(self) -> int:
        return sum(self.embedded)

    def runs(self) -> list[tuple[int, int]]:
        """``(offset in ids, length)`` of each maximal run of embedded positions."""
        out: list[tuple[int, int]] = []
        for i, flag in enumerate(self.embedded):
            if not flag:
                continue
            if out and out[-1][0] + out[-1][1] == i:
                out[-1] = (out[-1][0], out[-1][1] + 1)
            else:
                out.append((i, 1))
        return out


@dataclass
class PreparedImage:
    """One image ready for its connector's encoder (made on CPU, no weights involved).

    ``pixels`` is whatever that connector's ``encode`` takes for one image (usually
    ``(tiles, C, H, W)`` float32); ``digest`` is a content hash of it (computed when
    not given): the encoder-output cache key, and mixed into prefix-cache keys.
    """

    pixels: torch.Tensor
    tokens: ImageTokens
    digest: bytes = b""

    def __post_init__(self) -> None:
        if not self.digest:
            self.digest = tensor_digest(self.pixels)

    def spans(self, start: int) -> list[EmbeddingSpan]:
        """Pending engine spans for this image's ``tokens.ids`` placed at ``start``: one
        per run of embedded positions, each taking its rows of the one encoding."""
        spans, row = [], 0
        for offset, length in self.tokens.runs():
            key = hashlib.blake2b(self.digest + row.to_bytes(4, "little"), digest_size=16).digest()
            spans.append(
                EmbeddingSpan(
                    start + offset,
                    None,
                    key,
                    payload=self.pixels,
                    source=self.digest,
                    length=length,
                    offset=row,
                )
            )
            row += length
        return spans


class ImageProcessor(ABC):
    """Image -> ``PreparedImage`` on CPU, from the connector's config alone.

    Contract:
    - ``prepare`` is deterministic: the same RGB pixels give the same tensor, tokens
      and digest (so repeats hit the encoder cache and the prefix cache).
    - ``prepare(img).tokens.num_embeddings`` equals the row count ``encode`` returns
      for ``prepare(img).pixels``; tiling decides both.
    - ``image_text`` tells the server how a chat template shows images: ``None``
      means the template reads string content and the server writes
      ``connectors.prompt.IMAGE_MARKER`` where each image goes; a string (such as
      ``"<image>"``) means the template reads list content with ``{"type": "image"}``
      parts and prints that string for each one. Either way the server cuts the
      rendered prompt there and inserts ``tokens.ids``.
    """

    image_text: str | None = None

    @abstractmethod
    def prepare(self, image: Image.Image) -> PreparedImage:
        """A validated RGB image (``connectors.image_source.load_image``) -> its tensor(s)
        and prompt tokens."""

    def prepare_many(self, images: Sequence[Image.Image]) -> list[PreparedImage]:
        """``[prepare(im) for im in images]``, equal to it; a processor may batch the work
        (a captioning job's images arrive together)."""
        return [self.prepare(im) for im in images]

    def splice(
        self, text: str, images: Sequence[PreparedImage], encode: Callable[[str], list[int]]
    ) -> ImagePrompt:
        """A rendered prompt (``image_text``, or ``IMAGE_MARKER``, once per image) and its
        prepared images -> ids and pending spans. The default is
        ``connectors.prompt.splice_images``: the text between images tokenized piece by
        piece with ``encode``. A processor whose model must see the prompt tokenized whole
        (an HF checkpoint's: ``connectors.checkpoints``) overrides it."""
        from connectors.prompt import IMAGE_MARKER, splice_images

        return splice_images(text, images, encode, self.image_text or IMAGE_MARKER)


WARM_BATCHES = (1, 2, 8)  # images a step: alone, a pair, a captioning batch


class Connector(SpanEncoder):
    """A frozen vision encoder + projector in the LM's input-embedding space.

    Contract (on top of ``SpanEncoder``'s):
    - ``encode(pixels)`` takes the ``pixels`` of many ``PreparedImage``s from
      ``self.processor`` and returns one ``(tokens.num_embeddings, hidden_size)``
      tensor per image, in order, on the connector's device and the LM's dtype.
      It batches across images (one encoder pass for all tiles where shapes allow).
    - Encoder and projector run in inference mode; the connector holds no state
      between calls, so the engine may cache its outputs by ``PreparedImage.digest``.
    """

    processor: ImageProcessor
    hidden_size: int
    device: torch.device

    @abstractmethod
    def encode(self, payloads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Pixel tensors of ``PreparedImage``s -> their ``(n_i, hidden)`` embeddings."""

    def warm_up(self, batches: Sequence[int] = WARM_BATCHES) -> None:
        """Encode a blank image alone and in batches, so a fresh server's first image
        requests pay no first-use cost (kernel loading, GEMM algorithm choice) in their
        time to first token; the engine's own warm-up knows nothing of images."""
        pixels = self.processor.prepare(Image.new("RGB", (64, 64))).pixels
        for n in batches:
            self.encode([pixels] * n)


def tensor_digest(t: torch.Tensor) -> bytes:
    """A 16-byte content hash of a CPU tensor: dtype, shape and bytes."""
    t = t.detach().contiguous()
    head = f"{t.dtype}{tuple(t.shape)}".encode()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return hashlib.blake2b(head + data, digest_size=16).digest()
