"""A VLM checkpoint served live (``--model DIR``), through the ``openai`` SDK: image chat,
streamed and not, answers with the tokens HF transformers' ``generate`` gives for the same
conversation on the same saved directory (a tiny random SmolVLM, ``tiny_vlms``)."""

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
from tiny_vlms import build_smolvlm

from mmserve.config import EngineConfig, ServerConfig

transformers = pytest.importorskip("transformers")
MAX_TOKENS = 8


def _picture(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (width, height), tuple(int(c) for c in rng.integers(0, 255, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        draw.rectangle([x, y, x + width // 4, y + height // 4],
                       fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    return img


def _url(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory, default_model_dir) -> Iterator[tuple[str, openai.OpenAI]]:
    from mmserve.engine.async_engine import AsyncEngine

    path = build_smolvlm(default_model_dir, tmp_path_factory.mktemp("vlm") / "smolvlm")
    engine = AsyncEngine.from_config(EngineConfig(model=str(path), device="cpu",
                                                  kv_cache_memory_mb=32, max_model_len=1024))
    assert engine.image_processor is not None  # the checkpoint's own vision side
    with LiveServer(engine, ServerConfig(host="127.0.0.1", port=0, log_level="warning")) as srv:
        yield str(path), openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0,
                                       timeout=120)
    engine.shutdown_sync()


def _layout_tokens(processor, images: list[Image.Image]) -> int:
    """Prompt tokens HF's SmolVLM processor gives the images (wrappers included)."""
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    grid = processor.image_processor(images, return_row_col_info=True)
    texts = [get_image_prompt_string(r, c, processor.image_seq_len, processor.fake_image_token,
                                     processor.image_token, processor.global_image_token)
             for r, c in zip(grid["rows"][0], grid["cols"][0], strict=True)]
    return sum(len(processor.tokenizer(t, add_special_tokens=False)["input_ids"])
               for t in texts)


def test_image_chat_equals_hf_generate(served):
    path, client = served
    images = [_picture(120, 70, 0), _picture(40, 90, 1)]  # 3x2 and 1x3 tiles
    question = "What changed between these?"
    parts = [{"type": "text", "text": "Two pictures:"}]
    parts += [{"type": "image_url", "image_url": {"url": _url(i)}} for i in images]
    messages = [{"role": "user", "content": parts + [{"type": "text", "text": question}]}]

    processor = transformers.AutoProcessor.from_pretrained(path)
    hf = transformers.AutoModelForImageTextToText.from_pretrained(path).eval()
    hf_messages = [{"role": "user", "content": [{"type": "text", "text": "Two pictures:"},
                                                {"type": "image"}, {"type": "image"},
                                                {"type": "text", "text": question}]}]
    text = processor.apply_chat_template(hf_messages, add_generation_prompt=True)
    inputs = processor(text=text, images=images, return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    with torch.no_grad():
        ids = hf.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)[0, n:]
    want = processor.tokenizer.decode(ids, skip_special_tokens=True)

    full = client.chat.completions.create(model="smolvlm", messages=messages, temperature=0,
                                          max_tokens=MAX_TOKENS)
    assert len(want) > 8 and full.choices[0].message.content == want
    assert full.usage.prompt_tokens == n
    assert full.usage.prompt_tokens_details.image_tokens == _layout_tokens(processor, images)
    stream = client.chat.completions.create(model="smolvlm", messages=messages, temperature=0,
                                            max_tokens=MAX_TOKENS, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
