"""Prompt text with images -> token ids + pending embedding spans.

A chat template renders text; images go where ``IMAGE_MARKER`` (or the processor's
``image_text``) stands in the rendered prompt. The text between images is tokenized
piece by piece and each image's ``ImageTokens.ids`` are inserted between the pieces,
so the placeholder positions and the spans come from one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from PIL import Image

from connectors.base import ImageProcessor, PreparedImage
from connectors.image_source import ImageError, ImageErrorKind
from mmserve.engine.request import EmbeddingSpan

# private-use characters: no tokenizer merges them with neighbours, no user types them
IMAGE_MARKER = "\ue000image\ue000"


class ImagePrompt(NamedTuple):
    ids: list[int]
    spans: list[EmbeddingSpan]
    num_image_tokens: int  # prompt tokens the images occupy (wrappers included)


def splice_images(
    text: str,
    images: Sequence[PreparedImage],
    encode: Callable[[str], list[int]],
    marker: str = IMAGE_MARKER,
) -> ImagePrompt:
    """Cut ``text`` at each ``marker`` and put the images' tokens there, in order.

    ``encode`` tokenizes text without adding special tokens. The marker count must
    equal the image count (a user's text that contains the marker is refused).
    """
    pieces = text.split(marker)
    if len(pieces) != len(images) + 1:
        raise ImageError(
            ImageErrorKind.CORRUPT,
            f"the prompt shows {len(pieces) - 1} image positions for "
            f"{len(images)} images; message text must not contain {marker!r}",
        )
    ids: list[int] = []
    spans: list[EmbeddingSpan] = []
    n_image = 0
    for i, piece in enumerate(pieces):
        if piece:
            ids += encode(piece)
        if i < len(images):
            img = images[i]
            spans += img.spans(len(ids))
            ids += img.tokens.ids
            n_image += len(img.tokens.ids)
    return ImagePrompt(ids, spans, n_image)


def image_chat_prompt(
    tokenizer: Any, processor: ImageProcessor, images: Sequence[Image.Image], text: str
) -> ImagePrompt:
    """One user turn: the images (in order), then ``text``, through the chat template
    with the generation prompt: what the server builds for the same chat request."""
    return ImageChatPrompt(tokenizer, processor, text, len(images))(images)


class ImageChatPrompt:
    """``image_chat_prompt`` for many turns with one ``text`` and image count (a captioning
    job): the chat template is rendered once and each text piece tokenized once, so a
    call prepares only its images (the template and the tokenizer cost about as much as
    an image's preprocessing). Thread-safe: calls share only the piece cache."""

    MAX_PIECES = 64  # a processor's splice may tokenize text that varies with the image

    def __init__(
        self, tokenizer: Any, processor: ImageProcessor, text: str, num_images: int = 1
    ) -> None:
        self.tokenizer, self.processor, self.num_images = tokenizer, processor, num_images
        if processor.image_text is None:
            content: Any = IMAGE_MARKER * num_images + text
            marker = IMAGE_MARKER
        else:
            content = [{"type": "image"}] * num_images + [{"type": "text", "text": text}]
            marker = processor.image_text
        self.rendered: str = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True
        )
        assert marker in self.rendered or not num_images, "the chat template dropped the images"
        self._pieces: dict[str, list[int]] = {}

    def __call__(self, images: Sequence[Image.Image]) -> ImagePrompt:
        if len(images) != self.num_images:
            raise ValueError(f"this prompt takes {self.num_images} images, got {len(images)}")
        prepared = [self.processor.prepare(img) for img in images]
        return self.processor.splice(self.rendered, prepared, self._encode)

    def each(self, images: Sequence[Image.Image]) -> list[ImagePrompt]:
        """One prompt per image (a one-image turn), ``[self([im]) for im in images]``,
        with the images prepared together (``ImageProcessor.prepare_many``)."""
        if self.num_images != 1:
            raise ValueError(f"each() needs a one-image prompt, this one takes {self.num_images}")
        prepared = self.processor.prepare_many(images)
        return [self.processor.splice(self.rendered, [p], self._encode) for p in prepared]

    def _encode(self, piece: str) -> list[int]:
        ids = self._pieces.get(piece)
        if ids is None:
            ids = self.tokenizer.encode(piece, add_special_tokens=False)
            if len(self._pieces) >= self.MAX_PIECES:
                self._pieces.clear()
            self._pieces[piece] = ids
        return list(ids)
