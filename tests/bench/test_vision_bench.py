"""``mmserve bench vision`` on the CPU: the default connector and LM, both sides, a few
images. A check that the benchmark runs and that its two sides caption alike (the
engine's batched, paged, chunked decode against HF's ``generate``), not a speed claim."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("timm")
pytest.importorskip("transformers")

from mmserve.bench.vision import run_vision_bench  # noqa: E402


def test_bench_vision_cpu_matches_hf(default_model_dir, tmp_path):
    images = 6
    r = run_vision_bench(
        device="cpu",
        images=images,
        concurrency=(1, 4),
        max_tokens=8,
        out_dir=str(tmp_path),
        lm=str(default_model_dir),
        dtype="float32",
    )
    for c in ("1", "4"):
        assert r["mmserve"][c]["images_s"] > 0 and r["hf"][c]["images_s"] > 0
        assert len(r["mmserve"][c]["captions"]) == images
        assert all(r["mmserve"][c]["captions"])
        assert r["compare"][c]["identical_captions"] == images, (
            r["mmserve"][c]["captions"],
            r["hf"][c]["captions"],
        )
    saved = json.loads((tmp_path / "vision.json").read_text())
    assert saved["compare"] == r["compare"]
    assert (tmp_path / "vision.png").stat().st_size > 0
