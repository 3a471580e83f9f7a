"""Generated images with known contents: what the offline default learns to see.

A scene is 1-4 copies of one shape in one colour, grouped in one region of the
image, on a light, slightly noisy background; some scenes also carry a rendered
word elsewhere. Everything is drawn from a seed, so image ``i`` of a split is the
same on every machine. Captions are templated ("Two red circles in the top
left."), so a frozen LM's prior helps, and ``score_caption`` reads the four
attributes back out of any caption for the held-out accuracy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 165, 60),
    "blue": (45, 85, 225),
    "yellow": (235, 200, 30),
    "purple": (140, 60, 190),
    "orange": (245, 130, 20),
}
SHAPES = ("circle", "square", "triangle", "star")
COUNTS = ("one", "two", "three", "four")
POSITIONS = ("top left", "top right", "bottom left", "bottom right", "center")
WORDS = ("cat", "dog", "sun", "car", "tree", "fish", "book", "moon", "cup", "hat", "bus", "key")
ATTRIBUTES = ("colour", "shape", "count", "position")
# split name -> seed offset: held-out images never share a generator state with training
SPLITS = {"train": 0, "val": 1_000_003, "test": 2_000_029}
_REGION = {
    "top left": (0, 0),
    "top right": (1, 0),
    "bottom left": (0, 1),
    "bottom right": (1, 1),
    "center": (0.5, 0.5),
}


@dataclass(frozen=True)
class Scene:
    colour: str
    shape: str
    count: int  # 1..4
    position: str
    word: str | None = None

    def caption(self) -> str:
        noun = self.shape + ("s" if self.count > 1 else "")
        where = "in the center" if self.position == "center" else f"in the {self.position}"
        return f"{COUNTS[self.count - 1].capitalize()} {self.colour} {noun} {where}."

    def labels(self) -> dict[str, int]:
        """Class indices for encoder pretraining (word: 0 = none)."""
        return {
            "colour": list(COLOURS).index(self.colour),
            "shape": SHAPES.index(self.shape),
            "count": self.count - 1,
            "position": POSITIONS.index(self.position),
            "word": 0 if self.word is None else WORDS.index(self.word) + 1,
        }


HEADS = {
    "colour": len(COLOURS),
    "shape": len(SHAPES),
    "count": len(COUNTS),
    "position": len(POSITIONS),
    "word": len(WORDS) + 1,
}


def scene_of(split: str, index: int, word_p: float = 0.3) -> tuple[Scene, np.random.Generator]:
    """What image ``index`` of ``split`` shows, and the generator that then draws it."""
    rng = np.random.default_rng(SPLITS[split] + index)
    scene = Scene(
        str(rng.choice(list(COLOURS))),
        str(rng.choice(SHAPES)),
        int(rng.integers(1, 5)),
        str(rng.choice(POSITIONS)),
        str(rng.choice(WORDS)) if rng.random() < word_p else None,
    )
    return scene, rng


def sample(split: str, index: int, size: int = 64) -> tuple[Image.Image, Scene]:
    """Image ``index`` of ``split`` (deterministic) and what it shows."""
    scene, rng = scene_of(split, index)
    return render(scene, rng, size), scene


def render(scene: Scene, rng: np.random.Generator, size: int = 64) -> Image.Image:
    """Draw ``scene`` at ``size`` x ``size`` pixels with ``rng``'s jitter."""
    bg = rng.integers(215, 256, 3)
    noise = rng.normal(0, 4, (size, size, 3))
    img = Image.fromarray(np.clip(bg + noise, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    k = size / 64  # the layout is drawn for 64 px and scaled
    rx, ry = _REGION[scene.position]
    # the group sits around its region's centre (a quadrant's, or the image's), in a
    # 2 x 2 arrangement 15 px apart: a group's centre tells its position unambiguously;
    # shapes are 10-12 px across (a patch or two of the default encoder's 8 px patches),
    # with at least a pixel between neighbours
    gx = (16 + 32 * rx + rng.uniform(-1.5, 1.5)) * k
    gy = (16 + 32 * ry + rng.uniform(-1.5, 1.5)) * k
    colour = tuple(
        int(c) for c in np.clip(np.array(COLOURS[scene.colour]) + rng.integers(-18, 19, 3), 0, 255)
    )
    slots = [(-1, -1), (1, -1), (-1, 1), (1, 1)]
    single = scene.count == 1
    for slot in rng.permutation(4)[: scene.count]:
        dx, dy = (0, 0) if single else slots[slot]
        r = rng.uniform(5.0, 6.0) * k
        cx = gx + (7.5 * dx + rng.uniform(-0.8, 0.8)) * k
        cy = gy + (7.5 * dy + rng.uniform(-0.8, 0.8)) * k
        _shape(draw, scene.shape, cx, cy, r, colour)
    if scene.word is not None:
        _word(draw, scene, size, rng)
    return img


def _shape(
    draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill: tuple[int, ...]
) -> None:
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "square":
        s = r * 0.88
        draw.rectangle((cx - s, cy - s, cx + s, cy + s), fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=fill)
    else:  # star: five points, inner radius 0.45
        pts = [
            (
                cx + (r if k % 2 == 0 else 0.45 * r) * math.sin(k * math.pi / 5),
                cy - (r if k % 2 == 0 else 0.45 * r) * math.cos(k * math.pi / 5),
            )
            for k in range(10)
        ]
        draw.polygon(pts, fill=fill)


def _word(draw: ImageDraw.ImageDraw, scene: Scene, size: int, rng: np.random.Generator) -> None:
    """The word in black, in the half of the image away from the shapes."""
    font = ImageFont.load_default(size=max(8, size // 6))
    rx, ry = _REGION[scene.position]
    top = ry < 0.5 or (ry == 0.5 and rng.random() < 0.5)
    y = size * (0.78 if top else 0.06) + rng.uniform(-1, 1)
    x = size * (0.25 if rx >= 0.5 else 0.55) * rng.uniform(0.6, 1.0)
    draw.text((x, y), str(scene.word), fill=(20, 20, 20), font=font)


def _render_range(args: tuple[str, int, int, int]) -> tuple[np.ndarray, list[Scene]]:
    split, start, n, size = args
    pairs = [sample(split, i, size) for i in range(start, start + n)]
    return np.stack([np.asarray(img) for img, _ in pairs]), [s for _, s in pairs]


def generate(
    split: str, start: int, n: int, size: int = 64, workers: int = 1
) -> tuple[np.ndarray, list[Scene]]:
    """Images ``start .. start + n`` of ``split`` as one (n, size, size, 3) uint8 array and
    their scenes; the same arrays whatever ``workers`` is (each image has its own seed)."""
    chunk = max(1, -(-n // (workers * 4)))
    jobs = [(split, s, min(chunk, start + n - s), size) for s in range(start, start + n, chunk)]
    if workers <= 1 or len(jobs) == 1:
        parts = [_render_range(j) for j in jobs]
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(workers) as pool:  # spawn: safe beside CUDA
            parts = pool.map(_render_range, jobs)
    return np.concatenate([p[0] for p in parts]), [s for p in parts for s in p[1]]


_VOCAB = {"colour": tuple(COLOURS), "shape": SHAPES, "count": COUNTS, "position": POSITIONS}


def parse_caption(text: str) -> dict[str, str | None]:
    """The attributes a caption states (None where it names none or several)."""
    low = text.lower()
    out: dict[str, str | None] = {}
    for attr, vocab in _VOCAB.items():
        found = {v for v in vocab if re.search(rf"\b{v}s?\b", low)}
        if attr == "position" and "center" not in found and re.search(r"\bcent(er|re)\b", low):
            found.add("center")
        if attr == "count" and not found and re.search(r"\b(a|an)\b", low):
            found = {"one"}
        out[attr] = found.pop() if len(found) == 1 else None
    return out


def score_caption(text: str, scene: Scene) -> dict[str, bool]:
    """Per attribute: does the caption state the scene's value (and only it)?"""
    got = parse_caption(text)
    want = {
        "colour": scene.colour,
        "shape": scene.shape,
        "count": COUNTS[scene.count - 1],
        "position": scene.position,
    }
    return {a: got[a] == want[a] for a in ATTRIBUTES}
