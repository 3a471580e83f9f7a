"""``mmserve caption DIR | manifest.jsonl --out captions.jsonl``: batch captioning.

Inputs are the image files of a directory (sorted, by extension) or the ``"image"``
paths of a JSONL manifest (relative to it). ``concurrency`` requests are in flight at
once in one in-process engine, which batches their prefills, decodes and image
encodes step by step. Each finished image appends one line::

    {"image": "<path as listed>", "caption": "..."}   or   {"image": ..., "error": "..."}

Lines are written whole (one ``write`` of a complete line, flushed) in completion
order. A run on an existing ``--out`` first cuts off a torn last line (from a kill
mid-write), then skips every image that already has a line. A failing image (corrupt,
too large, unreadable) gets an error line and the job goes on. Captions are greedy and
the engine and connector are batch-invariant, so they do not depend on concurrency.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from connectors.image_source import ImageError, ImageLimits, file_bytes, load_image
from connectors.prompt import ImageChatPrompt
from mmserve.errors import InvalidRequestError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")


@dataclass
class JobResult:
    done: int  # images captioned (or failed) by this run
    skipped: int  # already in the output
    failed: int
    seconds: float


def list_images(source: str) -> list[tuple[str, Path]]:
    """(key written to the output, file) for each image of a directory or a manifest; a
    manifest line that names no image is a ``ValueError`` naming the file and line, before
    any image is captioned (a missing or unreadable image file is the job's own error line
    instead)."""
    src = Path(source)
    if src.is_dir():
        files = sorted(p for p in src.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        return [(str(p.relative_to(src)), p) for p in files]
    if not src.is_file():
        raise ValueError(f"{source}: no such directory or manifest file")
    out = []
    for n, line in enumerate(src.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{source}:{n}: not JSON ({err})") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("image"), str):
            raise ValueError(f'{source}:{n}: expected an object with an "image" path')
        out.append((entry["image"], src.parent / entry["image"]))
    return out


def done_keys(out: Path) -> set[str]:
    """Images that already have a line; a torn last line is cut off first."""
    if not out.is_file():
        return set()
    data = out.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with open(out, "r+b") as fh:
            fh.truncate(len(whole))
    keys = set()
    for line in whole.decode().splitlines():
        if line.strip():
            keys.add(json.loads(line)["image"])
    return keys


class LineWriter:
    """Appends whole JSON lines: one ``os.write`` per line on an O_APPEND descriptor."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        assert os.write(self.fd, line) == len(line)

    def close(self) -> None:
        os.close(self.fd)


async def caption_all(
    engine: Any,
    items: Iterable[tuple[str, Path]],
    out: Path,
    concurrency: int,
    instruction: str,
    params: Any,
    limits: ImageLimits | None = None,
    progress: bool = True,
) -> JobResult:
    """Caption every image of ``items`` not yet in ``out`` with ``engine`` (an AsyncEngine
    serving a connector), ``concurrency`` at a time."""
    processor = engine.image_processor
    if processor is None:
        raise ValueError("the engine serves no vision connector")
    limits = limits or ImageLimits()
    items = list(items)
    done = done_keys(out)
    todo = [(k, p) for k, p in items if k not in done]
    queue: asyncio.Queue[tuple[str, Path]] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    turn = ImageChatPrompt(engine.tokenizer, processor, instruction)  # rendered once
    writer = LineWriter(out)
    bar = tqdm(total=len(todo), desc="caption", unit="img", disable=not progress)
    failed = 0
    start = time.perf_counter()

    def prepare(path: Path) -> Any:
        return turn([load_image(file_bytes(path, limits), limits)])

    async def worker() -> None:
        nonlocal failed
        while not queue.empty():
            key, path = queue.get_nowait()
            try:
                prompt = await asyncio.to_thread(prepare, path)
                text = ""
                async for o in engine.generate(prompt.ids, params, spans=prompt.spans):
                    text = o.text
                record: dict[str, Any] = {"image": key, "caption": text}
            except (ImageError, OSError, InvalidRequestError) as exc:
                record, failed = {"image": key, "error": str(exc)}, failed + 1
            writer.write(record)
            bar.update(1)

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    finally:
        writer.close()
        bar.close()
    return JobResult(len(todo), len(items) - len(todo), failed, time.perf_counter() - start)
