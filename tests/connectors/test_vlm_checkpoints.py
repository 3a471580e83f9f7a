"""Real VLM checkpoint families against HF transformers, on tiny random checkpoints.

Each family's directory is written by transformers' own classes (``tiny_vlms``) and read
by both sides. Held equal to HF: the pixels (bit for bit), the prompt ids (image layout
included), the image features (the same float32 ops, so equal up to GEMM rounding), the
prefill logits and the greedy tokens of ``generate``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from tiny_vlms import BUILDERS

from connectors.checkpoints import load_connector, read_processor_files
from connectors.checkpoints.processor import template_messages
from connectors.image_source import ImageError
from mmserve.models.chat_template import render_chat_template
from mmserve.models.harness import SequenceRunner

transformers = pytest.importorskip("transformers")


def _png(width: int, height: int, seed: int) -> Image.Image:
    """A drawn picture, through a PNG round trip as a client would send it."""
    rng = np.random.default_rng(seed)
    colour = lambda: tuple(int(c) for c in rng.integers(0, 255, 3))  # noqa: E731
    img = Image.new("RGB", (width, height), colour())
    draw = ImageDraw.Draw(img)
    for _ in range(5):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        draw.ellipse([x, y, x + width // 3, y + height // 3], fill=colour())
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


# wide, tall, and large (3x3 tiles in SmolVLM, 2x2 in Idefics3)
IMAGES = [_png(90, 50, 0), _png(40, 120, 1), _png(300, 200, 2)]
CHATS = [[0], [1, 2]]  # image indices per conversation


def _chat(images: list[int]) -> list[dict]:
    parts = [{"type": "text", "text": "Look:"}]
    parts += [{"type": "image_url", "image_url": {"url": f"data:{i}"}} for i in images]
    return [{"role": "user", "content": parts + [{"type": "text", "text": "What is it?"}]}]


class Family:
    """One checkpoint loaded by both sides, and a prompt built by each."""

    def __init__(self, path) -> None:
        from mmserve.models.registry import load_model
        from mmserve.models.tokenizer import Tokenizer

        self.path = path
        self.hf_processor = transformers.AutoProcessor.from_pretrained(path)
        self.hf = transformers.AutoModelForImageTextToText.from_pretrained(path).eval()
        self.connector = load_connector(path)
        self.lm = load_model(path)
        self.tokenizer = Tokenizer(path)
        self.template = read_processor_files(path).chat_template

    def hf_inputs(self, images: list[int]):
        msgs = template_messages(_chat(images))
        text = self.hf_processor.apply_chat_template(msgs, add_generation_prompt=True)
        return self.hf_processor(text=text, images=[IMAGES[i] for i in images], return_tensors="pt")

    def ours(self, images: list[int]):
        """-> (prompt, its spans made ready by this connector's encode)."""
        text = render_chat_template(
            self.template,
            template_messages(_chat(images)),
            special_tokens=self.tokenizer.special_tokens,
        )
        processor = self.connector.processor
        prepared = [processor.prepare(IMAGES[i]) for i in images]
        prompt = processor.splice(text, prepared, self.tokenizer.encode)
        feats = dict(
            zip(
                [p.digest for p in prepared],
                self.connector.encode([p.pixels for p in prepared]),
                strict=True,
            )
        )
        rows = [feats[sp.source][sp.offset : sp.offset + sp.length] for sp in prompt.spans]
        return prompt, rows


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("vlms")
    return {name: build(default_model_dir, root / name) for name, build in BUILDERS.items()}


@pytest.fixture(scope="module")
def families(checkpoints):
    """name -> its ``Family``, each loaded once for the module."""
    loaded: dict[str, Family] = {}

    def get(name: str) -> Family:
        if name not in loaded:
            loaded[name] = Family(checkpoints[name])
        return loaded[name]

    return get


@pytest.fixture(scope="module", params=list(BUILDERS))
def family(request, families):
    return families(request.param)


def test_pixels_equal_hf_image_processor(family):
    for img in IMAGES:
        want = family.hf_processor.image_processor(img, return_tensors="pt")["pixel_values"]
        got = family.connector.processor.prepare(img).pixels
        assert torch.equal(want.reshape(-1, *got.shape[1:])[: got.shape[0]], got)


def test_encoding_does_not_depend_on_the_batch(family):
    """An image's rows are the same bits alone or among others (the engine batches the
    images of a step and caches encodings across steps)."""
    processor = family.connector.processor
    pixels = [processor.prepare(img).pixels for img in IMAGES]
    alone = family.connector.encode(pixels[1:2])[0]
    together = family.connector.encode(pixels)[1]
    assert torch.equal(alone, together)


@pytest.mark.parametrize("images", CHATS)
def test_prompt_ids_and_features_equal_hf(family, images):
    inputs = family.hf_inputs(images)
    prompt, rows = family.ours(images)
    assert prompt.ids == inputs["input_ids"][0].tolist()
    image_id = family.connector.processor.image_token_id
    assert [i for sp in prompt.spans for i in prompt.ids[sp.start : sp.end]] == [
        i for i in prompt.ids if i == image_id
    ]  # the spans cover every placeholder
    pixels = {k: v for k, v in inputs.items() if k.startswith("pixel")}
    with torch.no_grad():
        want = family.hf.model.get_image_features(**pixels).pooler_output
    want = torch.cat([w.reshape(-1, w.shape[-1]) for w in want])
    torch.testing.assert_close(torch.cat(rows), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("images", CHATS)
def test_greedy_tokens_equal_hf_generate(family, images):
    inputs = family.hf_inputs(images)
    n = inputs["input_ids"].shape[1]
    with torch.no_grad():
        want_logits = family.hf(**inputs).logits[0]
        want = family.hf.generate(**inputs, max_new_tokens=8, do_sample=False)[0, n:].tolist()
    prompt, rows = family.ours(images)
    embeds = family.lm.embed(torch.tensor(prompt.ids)).clone()
    for sp, x in zip(prompt.spans, rows, strict=True):
        embeds[sp.start : sp.end] = x
    runner = SequenceRunner(family.lm, max_len=n + 16)
    logits = runner.step(prompt.ids, 0, embeds=embeds)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    got = [int(logits[-1].argmax())]
    while len(got) < len(want) and got[-1] not in family.tokenizer.eos_token_ids:
        got.append(int(runner.step(got[-1:], n + len(got) - 1)[-1].argmax()))
    assert got == want


def test_engine_encodes_pending_spans_like_generate(families):
    """The engine path (the connector registered as its span encoder, prefill in chunks
    that cut through tiles, paged KV) gives HF's tokens."""
    from mmserve import LLM, SamplingParams

    fam = families("idefics3")
    inputs = fam.hf_inputs([1, 2])
    n = inputs["input_ids"].shape[1]
    want = fam.hf.generate(**inputs, max_new_tokens=8, do_sample=False)[0, n:].tolist()
    text = render_chat_template(
        fam.template, template_messages(_chat([1, 2])), special_tokens=fam.tokenizer.special_tokens
    )
    processor = fam.connector.processor
    prompt = processor.splice(
        text, [processor.prepare(IMAGES[i]) for i in (1, 2)], fam.tokenizer.encode
    )
    assert all(sp.pending for sp in prompt.spans)
    llm = LLM(str(fam.path), device="cpu", kv_cache_memory_mb=8, max_num_batched_tokens=64)
    llm.engine.set_span_encoder(fam.connector)
    out = llm.generate(
        prompt.ids, SamplingParams(temperature=0, max_tokens=8), spans=[prompt.spans]
    )
    assert out[0].token_ids == want


def test_marker_count_must_match_images(families):
    fam = families("llava_clip")
    processor = fam.connector.processor
    with pytest.raises(ImageError, match="2 image positions for 1 images"):
        processor.splice(
            "USER: <image>\n<image>\nhi ASSISTANT:",
            [processor.prepare(IMAGES[0])],
            fam.tokenizer.encode,
        )


def test_single_frame_layout_equals_hf_without_splitting(families):
    """Idefics3 with ``do_image_splitting`` off: one squeezed frame, the global layout."""
    import dataclasses

    fam = families("idefics3")
    processor = fam.connector.processor
    tiled = processor.frames
    processor.frames = dataclasses.replace(tiled, split=False)
    try:
        text = fam.hf_processor.apply_chat_template(
            template_messages(_chat([0])), add_generation_prompt=True
        )
        want = fam.hf_processor(
            text=text, images=[IMAGES[0]], do_image_splitting=False, return_tensors="pt"
        )
        prompt, _ = fam.ours([0])
        prepared = processor.prepare(IMAGES[0])
    finally:
        processor.frames = tiled
    assert prompt.ids == want["input_ids"][0].tolist() and len(prompt.spans) == 1
    assert (prepared.rows, prepared.cols) == (0, 0)
    assert torch.equal(prepared.pixels, want["pixel_values"][0])


def test_older_llava_tensor_layouts_load_alike(checkpoints):
    """transformers 4's names (``vision_tower.vision_model.*``) and the in-memory ones
    (``model.language_model.*``, ``model.vision_tower.*``) give the same model."""
    from connectors.checkpoints import LlavaConnector
    from mmserve.models import vlm_text
    from mmserve.models.tokenizer import Tokenizer
    from mmserve.models.weights import load_config, load_state_dict

    path = checkpoints["llava_clip"]
    config, sd = load_config(path), load_state_dict(path)
    files, tok = read_processor_files(path), Tokenizer(path)
    connector = LlavaConnector.from_checkpoint(config, files, sd, tok)
    pixels = [connector.processor.prepare(IMAGES[0]).pixels]
    want = connector.encode(pixels)[0]
    want_text = vlm_text.text_weights(config, sd)
    for old, new in [
        ("vision_tower.", "vision_tower.vision_model."),
        ("vision_tower.", "model.vision_tower."),
        ("language_model.model.", "model.language_model."),
    ]:
        renamed = {new + k[len(old) :] if k.startswith(old) else k: v for k, v in sd.items()}
        got = LlavaConnector.from_checkpoint(config, files, renamed, tok).encode(pixels)[0]
        assert torch.equal(got, want)
        text = vlm_text.text_weights(config, renamed)
        assert text.keys() == want_text.keys()
        assert all(torch.equal(text[k], want_text[k]) for k in text)


def test_transformers4_processor_files_read_alike(checkpoints, tmp_path):
    """preprocessor_config.json + chat_template.json (transformers 4's layout) give the
    same processor and template as transformers 5's processor_config.json + .jinja."""
    import json
    import shutil

    from connectors.checkpoints import load_processor
    from mmserve.models.tokenizer import Tokenizer

    new = checkpoints["smolvlm"]
    old = tmp_path / "smolvlm_hf4"
    old.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(new / name, old / name)
    processor = json.loads((new / "processor_config.json").read_text())
    (old / "preprocessor_config.json").write_text(json.dumps(processor.pop("image_processor")))
    (old / "processor_config.json").write_text(json.dumps(processor))
    template = (new / "chat_template.jinja").read_text()
    (old / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    prompts = []
    for path in (new, old):
        tok, proc = Tokenizer(path), load_processor(path)
        assert tok.chat_template == template
        text = tok.apply_chat_template(template_messages(_chat([0])))
        prompts.append(proc.splice(text, [proc.prepare(IMAGES[0])], tok.encode))
    assert prompts[0].ids == prompts[1].ids
    assert [sp.digest for sp in prompts[0].spans] == [sp.digest for sp in prompts[1].spans]


def _engine_greedy(engine, prompt, n: int) -> tuple[list[int], list[float]]:
    """Greedy tokens of one request run on ``engine`` and the log-probabilities it gave."""
    from mmserve import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=0)
    rid = engine.add_request(prompt.ids, params, spans=prompt.spans)
    logprobs: list[float] = []
    while True:
        for out in engine.step():
            if out.request_id == rid:
                logprobs += [lp.logprob for lp in out.new_logprobs or []]
                if out.finished:
                    return out.token_ids, logprobs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", list(BUILDERS))
def test_cuda_engine_picks_hf_best_tokens(checkpoints, name):
    """On the GPU (the engine's Triton kernels and CUDA graphs, pending image spans encoded
    by the engine), in float32 and bfloat16: the connector's features match HF's on the same
    GPU within the dtype's rounding, an image's encoding is the same bits alone or batched,
    and every greedy token is HF float32's best given the same prefix, or within rounding of
    it (the engine's float32 products run in TF32, so exact ties may break either way), with
    HF's log-probability within the same rounding."""
    from connectors.checkpoints import load_connector, load_processor
    from mmserve import LLM
    from mmserve.models.tokenizer import Tokenizer

    path, images = checkpoints[name], [1, 2]
    processor = transformers.AutoProcessor.from_pretrained(path)
    text = processor.apply_chat_template(
        template_messages(_chat(images)), add_generation_prompt=True
    )
    inputs = processor(text=text, images=[IMAGES[i] for i in images], return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    tok = Tokenizer(path)
    ours = load_processor(path, tok)
    prepared = [ours.prepare(IMAGES[i]) for i in images]
    prompt = ours.splice(
        tok.apply_chat_template(template_messages(_chat(images))), prepared, tok.encode
    )
    assert prompt.ids == inputs["input_ids"][0].tolist()
    reference = transformers.AutoModelForImageTextToText.from_pretrained(path).cuda()
    for dtype, slack in ((torch.float32, 0.02), (torch.bfloat16, 0.25)):
        hf = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).cuda()
        pixels = {
            k: (v.to(dtype) if v.is_floating_point() else v).cuda()
            for k, v in inputs.items()
            if k.startswith("pixel")
        }
        with torch.no_grad():
            want = hf.model.get_image_features(**pixels).pooler_output
        want = torch.cat([w.reshape(-1, w.shape[-1]) for w in want]).float()
        connector = load_connector(path, "cuda", dtype)
        encoded = connector.encode([p.pixels for p in prepared])
        tol = 1e-3 if dtype == torch.float32 else 5e-2
        torch.testing.assert_close(torch.cat(encoded).float(), want, rtol=tol, atol=tol)
        assert torch.equal(connector.encode([prepared[1].pixels])[0], encoded[1])
        llm = LLM(
            str(path), device="cuda", dtype=str(dtype).removeprefix("torch."), kv_cache_memory_mb=64
        )
        llm.engine.set_span_encoder(connector)
        got, logprobs = _engine_greedy(llm.engine, prompt, 8)
        ids = torch.tensor([prompt.ids + got], device="cuda")
        f32 = {k: v.float() if v.is_floating_point() else v for k, v in pixels.items()}
        with torch.no_grad():
            logits = reference(input_ids=ids, **f32).logits[0, n - 1 : n - 1 + len(got)]
        rows = torch.arange(len(got))
        picked = logits[rows, torch.tensor(got, device="cuda")]
        scale = slack * logits.std(dim=-1)
        assert (logits.max(dim=-1).values - picked <= scale).all(), (name, dtype, got)
        want = torch.log_softmax(logits, dim=-1)[rows, torch.tensor(got, device="cuda")]
        assert ((want.cpu() - torch.tensor(logprobs)).abs() <= scale.cpu()).all(), (
            name,
            dtype,
            want.tolist(),
            logprobs,
        )
        del hf, connector, llm
