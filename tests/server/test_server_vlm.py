"""VLM checkpoints served live (``--model DIR``), through the ``openai`` SDK: image chat,
streamed and not, and plain text chat answer with what HF transformers' ``generate`` gives
for the same conversation on the same saved directory. Two tiny random checkpoints
(``tiny_vlms``): SmolVLM (tiles) and LLaVA-1.5 (a tokenizer that adds BOS, which the prompt
must carry with or without images)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import torch
from live_server import LiveServer
from PIL import Image, ImageDraw
from tiny_vlms import build_llava_clip, build_smolvlm

from mmserve.config import EngineConfig, ServerConfig

transformers = pytest.importorskip("transformers")
MAX_TOKENS = 8
BUILDERS = {"smolvlm": build_smolvlm, "llava_clip": build_llava_clip}


def _picture(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (width, height), tuple(int(c) for c in rng.integers(0, 255, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        draw.rectangle(
            [x, y, x + width // 4, y + height // 4],
            fill=tuple(int(c) for c in rng.integers(0, 255, 3)),
        )
    return img


def _url(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class Served:
    def __init__(self, name: str, path, client: openai.OpenAI) -> None:
        self.name, self.client = name, client
        self.processor = transformers.AutoProcessor.from_pretrained(path)
        self.hf = transformers.AutoModelForImageTextToText.from_pretrained(path).eval()

    def hf_answer(self, parts: list[dict], images: list[Image.Image]):
        """(text, prompt length) of HF's greedy answer to one user turn."""
        msgs = [{"role": "user", "content": parts}]
        text = self.processor.apply_chat_template(msgs, add_generation_prompt=True)
        inputs = self.processor(text=text, images=images or None, return_tensors="pt")
        n = inputs["input_ids"].shape[1]
        with torch.no_grad():
            ids = self.hf.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)[0, n:]
        return self.processor.tokenizer.decode(ids, skip_special_tokens=True), n

    def ask(self, content: list[dict], stream: bool = False):
        return self.client.chat.completions.create(
            model=self.name,
            messages=[{"role": "user", "content": content}],
            temperature=0,
            max_tokens=MAX_TOKENS,
            stream=stream,
        )


@pytest.fixture(scope="module", params=list(BUILDERS))
def served(request, tmp_path_factory, default_model_dir) -> Iterator[Served]:
    from mmserve.engine.async_engine import AsyncEngine

    name = request.param
    path = BUILDERS[name](default_model_dir, tmp_path_factory.mktemp("vlm") / name)
    engine = AsyncEngine.from_config(
        EngineConfig(model=str(path), device="cpu", kv_cache_memory_mb=32, max_model_len=1024)
    )
    assert engine.image_processor is not None  # the checkpoint's own vision side
    with LiveServer(engine, ServerConfig(host="127.0.0.1", port=0, log_level="warning")) as srv:
        yield Served(
            name,
            path,
            openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=120),
        )
    engine.shutdown_sync()


def _image_tokens(processor, images: list[Image.Image], ids: torch.Tensor) -> int:
    """Prompt tokens HF's processor gives the images, wrappers included (SmolVLM's tile
    markers; a LLaVA image is its run of ``<image>`` ids)."""
    if not hasattr(processor, "global_image_token"):
        return int((ids == processor.image_token_id).sum())
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    grid = processor.image_processor(images, return_row_col_info=True)
    texts = [
        get_image_prompt_string(
            r,
            c,
            processor.image_seq_len,
            processor.fake_image_token,
            processor.image_token,
            processor.global_image_token,
        )
        for r, c in zip(grid["rows"][0], grid["cols"][0], strict=True)
    ]
    return sum(len(processor.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)


def test_image_chat_equals_hf_generate(served):
    images = [_picture(120, 70, 0), _picture(40, 90, 1)]  # SmolVLM: 3x2 and 1x3 tiles
    question = "What changed between these?"
    hf_parts = [
        {"type": "text", "text": "Two pictures:"},
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": question},
    ]
    want, n = served.hf_answer(hf_parts, images)
    parts = [
        {"type": "image_url", "image_url": {"url": _url(img)}} if p["type"] == "image" else p
        for p, img in zip(hf_parts, [None, *images, None], strict=True)
    ]
    full = served.ask(parts)
    assert len(want) > 8 and full.choices[0].message.content == want
    assert full.usage.prompt_tokens == n
    ids = served.processor(
        text=served.processor.apply_chat_template(
            [{"role": "user", "content": hf_parts}], add_generation_prompt=True
        ),
        images=images,
        return_tensors="pt",
    )["input_ids"]
    assert full.usage.prompt_tokens_details.image_tokens == _image_tokens(
        served.processor, images, ids
    )
    streamed = "".join(
        c.choices[0].delta.content or "" for c in served.ask(parts, True) if c.choices
    )
    assert streamed == want


def test_text_chat_equals_hf_generate(served):
    """No image: the prompt is still the processor's (LLaVA-1.5's BOS included)."""
    parts = [{"type": "text", "text": "Say something about the sea."}]
    want, n = served.hf_answer(parts, [])
    full = served.ask(parts)
    assert len(want) > 8 and full.choices[0].message.content == want
    assert full.usage.prompt_tokens == n
