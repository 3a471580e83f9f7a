"""The timm connector on a tiny random ViT: tiles and image tokens agree with what
``encode`` returns, encodings do not depend on the batch, the preprocessing is timm's
own, and pixel shuffle matches Idefics3's reference formula."""

import numpy as np
import pytest
import torch
from PIL import Image

from connectors.encoder import (
    EncoderSpec,
    Preprocess,
    TimmEncoder,
    create_encoder_model,
    data_config,
)
from connectors.projector import Projector, ProjectorSpec, pixel_shuffle
from connectors.timm_connector import ConnectorConfig, TimmConnector, TimmProcessor

SPEC = EncoderSpec(
    "vit_tiny_patch16_224",
    dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2),
    None,
    dict(input_size=(3, 32, 32), crop_pct=1.0, crop_mode="squash"),
)


class Ids:
    def __call__(self, text: str) -> int:
        return 7

    def encode(self, text: str) -> list[int]:
        return [5, 6]


@pytest.fixture(scope="module")
def connector() -> TimmConnector:
    torch.manual_seed(0)
    model = create_encoder_model(SPEC)
    cfg = ConnectorConfig(SPEC, ProjectorSpec("shuffle_mlp", 32, 24, 2), (4, 4), max_tiles=4)
    proc = TimmProcessor(cfg, Preprocess(data_config(model, SPEC)), Ids())
    return TimmConnector(
        cfg,
        TimmEncoder(model),
        Projector(cfg.projector),
        proc,
        torch.device("cpu"),
        torch.float32,
        chunk=4,
    )


def _img(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def test_tiles_and_tokens_agree_with_encode(connector):
    proc = connector.processor
    for size, grid in (
        ((20, 20), (1, 1)),
        ((64, 32), (1, 2)),
        ((90, 70), (2, 2)),
        ((200, 40), (1, 4)),
    ):
        img = _img(*size)
        assert proc.tile_grid(img) == grid
        prep = proc.prepare(img)
        views = grid[0] * grid[1] + (grid != (1, 1))
        assert prep.pixels.shape == (views, 3, 32, 32)
        assert prep.tokens.num_embeddings == views * 4  # 4 tokens a view
        assert len(prep.tokens.runs()) == views and prep.tokens.ids.count(5) == views - 1
        (rows,) = connector.encode([prep.pixels])
        assert rows.shape == (prep.tokens.num_embeddings, 24)


def test_encodings_do_not_depend_on_the_batch(connector):
    preps = [connector.processor.prepare(_img(40 + 30 * i, 50, i)) for i in range(3)]
    alone = [connector.encode([p.pixels])[0] for p in preps]
    together = connector.encode([p.pixels for p in preps])
    assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))


def test_preprocessing_is_timms_own_transform(connector):
    from timm.data import create_transform

    img = _img(50, 30)
    cfg = connector.processor.preprocess.cfg
    ref = create_transform(**cfg, is_training=False)(img)
    assert torch.equal(connector.processor.preprocess(img), ref)


@pytest.mark.parametrize("crop_mode", ["squash", "center"])
def test_prepared_together_equals_prepared_each(crop_mode):
    """``prepare_many`` batches images already at the tile size; every image's pixels,
    digest and tokens equal ``prepare``'s (and so timm's transform's) bit for bit, the
    others (larger, smaller, tiled) take ``prepare`` itself, in order."""
    spec = EncoderSpec(SPEC.name, SPEC.kwargs, None, {**SPEC.data, "crop_mode": crop_mode})
    model = create_encoder_model(spec)
    cfg = ConnectorConfig(spec, ProjectorSpec("shuffle_mlp", 32, 24, 2), (4, 4), max_tiles=4)
    proc = TimmProcessor(cfg, Preprocess(data_config(model, spec)), Ids())
    images = [_img(32, 32, i) for i in range(5)] + [_img(90, 70, 9), _img(20, 20, 8)]
    images.insert(2, _img(64, 32, 7))
    many = proc.prepare_many(images)
    assert len(many) == len(images)
    for img, got in zip(images, many, strict=True):
        want = proc.prepare(img)
        assert got.pixels.dtype == want.pixels.dtype and torch.equal(got.pixels, want.pixels)
        assert got.digest == want.digest and got.tokens == want.tokens
        if img.size == (32, 32):  # the batched path: timm's own transform, bit for bit
            assert torch.equal(got.pixels[0], proc.preprocess(img))
    # keyed by content: a copy of an image shares its digest, another image does not
    assert len({p.digest for p in many}) == len(images)
    assert proc.prepare(images[0].copy()).digest == many[0].digest


def test_pixel_shuffle_matches_idefics3():
    x = torch.randn(2, 16, 6)  # (B, seq, C) as Idefics3 gets it

    def reference(x, scale):  # Idefics3Connector.pixel_shuffle, transcribed
        bsz, seq, dim = x.size()
        h = w = int(seq**0.5)
        x = x.view(bsz, h, w, dim).view(bsz, h, int(w / scale), dim * scale).permute(0, 2, 1, 3)
        x = x.reshape(bsz, int(w / scale), int(h / scale), dim * scale**2).permute(0, 2, 1, 3)
        return x.reshape(bsz, int(seq / scale**2), dim * scale**2)

    assert torch.equal(pixel_shuffle(x.view(2, 4, 4, 6), 2), reference(x, 2))


def test_warm_up_encodes_blank_images_and_changes_nothing(connector, monkeypatch):
    """The start-up warm-up encodes a blank image alone and in batches, through the
    connector's own processor; encodings after it equal those before (no state kept)."""
    prep = connector.processor.prepare(_img(40, 50))
    before = connector.encode([prep.pixels])[0]
    seen = []
    encode = connector.encode
    monkeypatch.setattr(connector, "encode", lambda px: seen.append(len(px)) or encode(px))
    connector.warm_up()
    assert seen == [1, 2, 8]
    monkeypatch.undo()
    assert torch.equal(connector.encode([prep.pixels])[0], before)
