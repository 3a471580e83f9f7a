"""Image chat through the ``openai`` SDK against a live server with the shipped default
connector: streamed and not, several images, image tokens in usage, a repeat image
served from the encoder cache (or, behind the same prefix, from the prefix cache), and
a 400 naming what is allowed for every bad-image class, after which the server still
serves."""

import base64
import io
import struct
import zlib
from collections.abc import Iterator

import httpx
import openai
import pytest
from live_server import LiveServer, wait_for_idle
from PIL import Image

from connectors import synthetic
from connectors.prompt import image_chat_prompt
from mmserve.config import ServerConfig
from mmserve.sampling_params import SamplingParams

MAX_TOKENS = 10
LIMITS = dict(max_image_bytes=150_000, max_image_pixels=600 * 600, max_images_per_request=2)


def _url(img: Image.Image, fmt: str = "PNG", mime: str = "image/png") -> str:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def _part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _ask(*urls: str, text: str = "Describe the image.") -> list[dict]:
    return [
        {"role": "user", "content": [*(_part(u) for u in urls), {"type": "text", "text": text}]}
    ]


@pytest.fixture(scope="module")
def vision(engine) -> Iterator[tuple[LiveServer, openai.OpenAI]]:
    if engine.image_processor is None:
        pytest.fail("the default server serves no connector: connectors/default is missing")
    config = ServerConfig(host="127.0.0.1", port=0, log_level="warning", **LIMITS)
    with LiveServer(engine, config) as srv:
        yield srv, openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=120)


def _metric(srv: LiveServer, name: str) -> float:
    text = httpx.get(f"{srv.url}/metrics").text
    line = next(x for x in text.splitlines() if x.startswith(f"mmserve_{name}_total{{"))
    return float(line.rsplit(" ", 1)[1])


def test_image_chat_stream_and_not_equal_the_engine(vision, engine, model_name):
    srv, client = vision
    img, scene = synthetic.sample("test", 3)
    msgs = _ask(_url(img))
    full = client.chat.completions.create(
        model=model_name, messages=msgs, temperature=0, max_tokens=MAX_TOKENS
    )
    n_img = engine.image_processor.prepare(img).tokens.num_embeddings
    assert full.usage.prompt_tokens_details.image_tokens == n_img
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model_name, messages=msgs, temperature=0, max_tokens=MAX_TOKENS, stream=True
        )
        if c.choices
    )
    assert streamed == full.choices[0].message.content
    # the reference: the same prompt built in-process and run on the engine directly
    prompt = image_chat_prompt(
        engine.tokenizer, engine.image_processor, [img], "Describe the image."
    )
    assert full.usage.prompt_tokens == len(prompt.ids)

    async def direct() -> str:
        text = ""
        async for o in engine.generate(
            prompt.ids, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), spans=prompt.spans
        ):
            text = o.text
        return text

    import asyncio

    assert asyncio.run(direct()) == full.choices[0].message.content
    # the shipped default sees: this image's caption names its colour and shape
    assert synthetic.parse_caption(full.choices[0].message.content)["colour"] == scene.colour


def test_two_images_and_a_repeat_served_from_the_encoder_cache(vision, engine, model_name):
    srv, client = vision
    a, b = synthetic.sample("test", 5)[0], synthetic.sample("test", 6)[0]
    r = client.chat.completions.create(
        model=model_name, messages=_ask(_url(a), _url(b)), temperature=0, max_tokens=4
    )
    per = engine.image_processor.prepare(a).tokens.num_embeddings
    assert r.usage.prompt_tokens_details.image_tokens == 2 * per
    encoded, hits = _metric(srv, "encoder_payloads"), _metric(srv, "encoder_cache_hits")
    # the same image after other text: no prefix-cache reuse, but no encode either
    client.chat.completions.create(
        model=model_name,
        temperature=0,
        max_tokens=4,
        messages=[{"role": "system", "content": "Be brief."}, *_ask(_url(a))],
    )
    assert _metric(srv, "encoder_payloads") == encoded
    assert _metric(srv, "encoder_cache_hits") == hits + 1
    # the same request again: its image's KV blocks come from the prefix cache, so the
    # image needs neither the encoder nor its cache
    hits, reused = _metric(srv, "encoder_cache_hits"), _metric(srv, "prefix_cache_hit_tokens")
    client.chat.completions.create(
        model=model_name, messages=_ask(_url(a), _url(b)), temperature=0, max_tokens=4
    )
    assert _metric(srv, "prefix_cache_hit_tokens") - reused >= 2 * per
    assert (_metric(srv, "encoder_payloads"), _metric(srv, "encoder_cache_hits")) == (encoded, hits)


def _bomb(side: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 1024))
        + chunk(b"IEND", b"")
    )


def test_every_bad_image_class_is_a_400_and_the_server_keeps_serving(vision, engine, model_name):
    srv, client = vision
    baseline = engine.stats().kv_blocks_used
    good = _url(synthetic.sample("test", 7)[0])
    png = base64.b64decode(good.split(",", 1)[1])
    noise = Image.frombytes("RGB", (300, 300), bytes(range(256)) * 1055)
    cases = {
        "corrupt": "data:image/png;base64," + base64.b64encode(b"not an image").decode(),
        "truncated": "data:image/png;base64," + base64.b64encode(png[: len(png) // 2]).decode(),
        "too_large": _url(noise, "BMP", "image/bmp"),  # 270 kB of pixels
        "bomb": "data:image/png;base64," + base64.b64encode(_bomb(40_000)).decode(),
        "pixels": "data:image/png;base64," + base64.b64encode(_bomb(1_000)).decode(),
        "unsupported": _url(Image.new("RGB", (8, 8)), "TIFF", "image/tiff"),
        "remote": "http://127.0.0.1:9/cat.png",
    }
    for kind, url in cases.items():
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=model_name, messages=_ask(url), max_tokens=2)
        err = info.value.body
        assert "allowed" in err["message"] or "send" in err["message"], (kind, err)
        assert err["param"] == "messages.0.content.0", (kind, err)
    with pytest.raises(openai.BadRequestError, match="at most 2"):
        client.chat.completions.create(
            model=model_name, messages=_ask(good, good, good), max_tokens=2
        )
    ok = client.chat.completions.create(model=model_name, messages=_ask(good), max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")
    wait_for_idle(engine, baseline)
