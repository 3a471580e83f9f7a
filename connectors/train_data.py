"""Training data for a connector: (image, caption) pairs -> cached features + token layouts.

Pairs come from a JSONL manifest (``{"image": path, "caption": text}`` per line, paths
relative to the manifest) or from the generator (``synthetic:N``: images 0..N-1 of the
"train" split). The frozen encoder runs over every image ONCE; its patch grids are
kept (on disk beside the checkpoints, so a resumed run does not encode again).

Each example is laid out exactly as the server lays out a chat request with one image
at the start of the user message: the chat template's text before the image
(``prefix``, the same for every example), the image's tokens, the rest of the user
turn and the assistant header (``suffix``, one per instruction), then the caption and
the end-of-turn token (``target``: the only tokens with a loss).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from connectors import synthetic
from connectors.encoder import Preprocess, TimmEncoder
from connectors.image_source import ImageLimits, file_bytes, load_image
from connectors.prompt import IMAGE_MARKER

INSTRUCTIONS = (
    "Describe the image.",
    "What is in this image?",
    "Caption this image.",
    "What do you see?",
    "Describe this picture briefly.",
)


@dataclass
class Pair:
    image: str | int  # a file path, or an index of the generator's ``split``
    caption: str
    split: str = "train"

    def load(self) -> Image.Image:
        if isinstance(self.image, int):
            return synthetic.sample(self.split, self.image)[0]
        return load_image(file_bytes(self.image, ImageLimits()), ImageLimits())


def read_pairs(data: str) -> list[Pair]:
    """``synthetic:N`` or a JSONL manifest path -> pairs."""
    if data.startswith("synthetic:"):
        n = int(data.split(":", 1)[1])
        return [Pair(i, synthetic.scene_of("train", i)[0].caption()) for i in range(n)]
    root = Path(data).parent
    pairs = []
    for line in Path(data).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            pairs.append(Pair(str(root / rec["image"]), str(rec["caption"])))
    return pairs


@torch.no_grad()
def encode_features(
    pairs: Sequence[Pair],
    encoder: TimmEncoder,
    preprocess: Preprocess,
    device: torch.device,
    cache: Path | None,
    batch_size: int = 256,
    progress: bool = True,
    workers: int = 1,
) -> torch.Tensor:
    """(N, H, W, C) bf16 patch grids of every pair's image, from ``cache`` when it holds
    them for these pairs."""
    key = f"{len(pairs)}:{pairs[0].split}:{pairs[0].image}:{pairs[-1].image}" if pairs else "0"
    if cache is not None and cache.is_file():
        stored = load_file(str(cache))
        if stored["key"].numpy().tobytes().decode() == key:
            return stored["features"]
    chunks = []
    enc = encoder.to(device)
    generated = _generated(pairs, preprocess, workers)
    for i in tqdm(
        range(0, len(pairs), batch_size), desc="encode images", unit="batch", disable=not progress
    ):
        if generated is not None:
            pixels = preprocess.normalize_uint8(generated[i : i + batch_size])
        else:
            pixels = torch.stack([preprocess(p.load()) for p in pairs[i : i + batch_size]])
        chunks.append(enc(pixels.to(device)).to("cpu", torch.bfloat16))
    feats = torch.cat(chunks)
    if cache is not None:
        key_t = torch.frombuffer(bytearray(key.encode()), dtype=torch.uint8)
        save_file({"features": feats.contiguous(), "key": key_t}, str(cache))
    return feats


def _generated(pairs: Sequence[Pair], preprocess: Preprocess, workers: int) -> torch.Tensor | None:
    """All of ``pairs`` drawn at once by the generator's pool, when they are generated
    images 0..N-1 at the encoder's input size (else None: load them one by one)."""
    if not pairs or [p.image for p in pairs] != list(range(len(pairs))):
        return None
    size, split = preprocess.size[0], pairs[0].split
    if preprocess.size != (size, size) or any(p.split != split for p in pairs):
        return None
    arr, _ = synthetic.generate(split, 0, len(pairs), size, workers)
    return torch.from_numpy(arr)


@dataclass
class Layout:
    """Token ids around the image for one instruction; captions follow ``suffix``."""

    prefix: list[int]
    suffix: list[int]


def layouts(tokenizer, instructions: Sequence[str]) -> list[Layout]:
    """The chat template split at the image, one layout per instruction. Every layout
    shares one prefix (asserted): its KV can be computed once for a whole run."""
    out = []
    for text in instructions:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": IMAGE_MARKER + text}], add_generation_prompt=True
        )
        before, after = rendered.split(IMAGE_MARKER)
        out.append(
            Layout(
                tokenizer.encode(before, add_special_tokens=False),
                tokenizer.encode(after, add_special_tokens=False),
            )
        )
    assert all(lay.prefix == out[0].prefix for lay in out), "instructions change the prefix"
    return out


def target_ids(tokenizer, caption: str, end_id: int) -> list[int]:
    """The caption's ids and the end-of-turn id: what the loss is on."""
    return tokenizer.encode(caption, add_special_tokens=False) + [end_id]
