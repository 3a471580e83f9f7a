"""``mmserve caption`` with the shipped default connector: killed mid-run, resumed (a torn
last line cut off, done images skipped), every image once, a corrupt one recorded with
its error, and the captions equal to a one-at-a-time run of the same job."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connectors import synthetic

N = 4
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("images")
    for i in range(N):
        synthetic.sample("test", 100 + i)[0].save(d / f"img{i}.png")
    (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return d


def _records(path: Path) -> dict[str, dict]:
    lines = path.read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    keys = [r["image"] for r in recs]
    assert len(keys) == len(set(keys)), "an image was written twice"
    return {r["image"]: r for r in recs}


@pytest.fixture(scope="module")
def engine():
    from mmserve.config import EngineConfig
    from mmserve.engine.async_engine import AsyncEngine

    eng = AsyncEngine.from_config(EngineConfig(device="cpu", max_model_len=256))
    yield eng
    eng.shutdown_sync()


def _run_job(engine, images: Path, out: Path, concurrency: int):
    import asyncio

    from connectors.caption_job import caption_all, list_images
    from mmserve.sampling_params import SamplingParams

    return asyncio.run(
        caption_all(
            engine,
            list_images(str(images)),
            out,
            concurrency,
            "Describe the image.",
            SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
            progress=False,
        )
    )


def test_killed_job_resumes_with_the_same_captions(images, engine, tmp_path):
    out = tmp_path / "captions.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "mmserve.cli",
        "caption",
        str(images),
        "--out",
        str(out),
        "--concurrency",
        "1",
        "--max-tokens",
        str(MAX_TOKENS),
        "--device",
        "cpu",
        "--max-model-len",
        "256",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (out.is_file() and out.read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, "the job never wrote"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = _records(out)
    assert 2 <= len(before) < N + 1
    with open(out, "ab") as fh:  # as if killed in the middle of writing a line
        fh.write(b'{"image": "img3.png", "capt')
    result = _run_job(engine, images, out, concurrency=4)
    assert result.skipped == len(before) and result.done == N + 1 - len(before)
    after = _records(out)
    assert set(after) == {f"img{i}.png" for i in range(N)} | {"broken.png"}
    assert "error" in after["broken.png"] and "caption" not in after["broken.png"]
    assert all(after[k] == v for k, v in before.items())
    # the reference: the whole job again, one image at a time, into a fresh file
    ref = tmp_path / "ref.jsonl"
    _run_job(engine, images, ref, concurrency=1)
    assert _records(ref) == after


def test_a_manifest_lists_its_images_relative_to_it(tmp_path):
    from connectors.caption_job import list_images

    manifest = tmp_path / "job" / "manifest.jsonl"
    manifest.parent.mkdir()
    manifest.write_text('{"image": "sub/a.png"}\n\n{"image": "b.png", "note": 1}\n')
    assert list_images(str(manifest)) == [
        ("sub/a.png", manifest.parent / "sub" / "a.png"),
        ("b.png", manifest.parent / "b.png"),
    ]


@pytest.mark.parametrize(
    "bad,says",
    [("not json", "not JSON"), ('{"path": "c.png"}', '"image"'), ('["c.png"]', '"image"')],
)
def test_a_bad_manifest_line_is_named_before_the_model_loads(tmp_path, capsys, bad, says):
    from mmserve.cli import main

    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text('{"image": "a.png"}\n\n' + bad + "\n")
    out = tmp_path / "out.jsonl"
    # the model named does not exist: only an error before loading it can say this
    assert main(["caption", str(manifest), "--out", str(out), "--model", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert f"{manifest}:3: " in err and says in err
    assert not out.exists()
