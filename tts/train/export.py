"""Stage 4 of ``mmserve voice train``: backbone + codec decoder -> one voice directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def export_voice(work: Path, out: Path, name: str = "default", corpus: dict | None = None) -> None:
    """``corpus``: how the teacher sentences were drawn (the quality report re-draws the
    held-out ones)."""
    backbone, codec = work / "backbone" / "final", work / "codec" / "final"
    for need in (backbone / "model.safetensors", codec / "codec.safetensors"):
        if not need.is_file():
            raise FileNotFoundError(f"{need} is missing: run the codec and backbone stages")
    out.mkdir(parents=True, exist_ok=True)
    for f in backbone.iterdir():
        if f.name != "vocab.json":
            shutil.copy2(f, out / f.name)
    shutil.copytree(codec, out / "codec", dirs_exist_ok=True)
    vocab = json.loads((backbone / "vocab.json").read_text())
    meta = {
        "kind": "phoneme-frame",
        "name": name,
        **vocab,
        "codec": "codec",
        "temperature": 0.0,
        "max_frames_per_phoneme": 40,
        "teacher": "espeak-ng en-us (espeakng-loader)",
        "corpus": corpus or {},
    }
    (out / "voice.json").write_text(json.dumps(meta, indent=1))
