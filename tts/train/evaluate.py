"""``mmserve voice eval``: the default voice against its teacher on held-out sentences.

For each held-out sentence (re-drawn from the corpus settings in ``voice.json``, never
trained on): espeak-ng's rendering (the teacher), the voice's, and the codec's own
resynthesis of the teacher audio (encode -> decode: the best the voice could do with
this codec). Reported: DTW-aligned MCD of voice and of resynthesis against the teacher,
their difference (target <= 1.5 dB), speech durations against the teacher's (target
within 15 %), and spectrogram PNGs (teacher / resynthesis / voice) for the first few.
The resynthesis needs the codec's encoder, which only the training work directory has.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from tts import quality
from tts.train.corpus import sentences
from tts.train.probes import PROBES
from tts.train.teacher import speak

MCD_TARGET_DB, DURATION_TARGET = 1.5, 0.15


def evaluate(
    voice_dir: str | None, cfg, report: str, n: int, pictures: int = 4, held_out_of: str = ""
) -> dict:
    """``held_out_of``: score the held-out sentences of that corpus kind instead of the
    voice's own (any the voice trained on are left out), to compare voices of two kinds."""
    from tts.framecodec import FrameCodec
    from tts.registry import voice_dir as resolve
    from tts.synthesizer import Synthesizer

    vdir = resolve(voice_dir)
    meta = json.loads((vdir / "voice.json").read_text())
    corpus = meta.get("corpus") or {
        "sentences": cfg.sentences,
        "held_out": cfg.held_out,
        "seed": cfg.seed,
        "kind": cfg.corpus,
    }
    texts = held_out_texts(corpus, n, held_out_of)
    synth = Synthesizer(str(vdir), device=cfg.device if cfg.device != "auto" else "auto")
    encoder = _trained_codec(cfg, FrameCodec)
    out = Path(report)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, text in enumerate(texts):
        teacher, _ = speak(text)
        t0 = time.perf_counter()
        voice = synth.synthesize(text).samples
        row = {"synth_s": time.perf_counter() - t0, **_against_teacher(text, teacher, voice)}
        pics = [("teacher (espeak-ng)", teacher)]
        if encoder is not None:
            with torch.inference_mode():
                codes = encoder.encode(torch.from_numpy(teacher)[None]).codes[..., None]
                resynth = encoder.decode(codes)[0].numpy()
            row["mcd_resynth_db"] = quality.mcd(teacher, resynth)
            pics.append(("codec resynthesis", resynth))
        pics.append(("voice", voice))
        if i < pictures:
            quality.spectrogram_png(pics, out / f"spectrogram_{i}.png")
        rows.append(row)
        print(
            f"[{i + 1}/{len(texts)}] MCD voice {row['mcd_voice_db']:.2f} dB"
            + (f", resynth {row['mcd_resynth_db']:.2f} dB" if "mcd_resynth_db" in row else "")
            + f"; {row['voice_s']:.2f} s vs {row['teacher_s']:.2f} s",
            flush=True,
        )
    scored = held_out_of or corpus.get("kind", "templates")
    summary = {"held_out_of": scored, **_summary(rows)}
    extra = {name: _probe(synth, texts) for name, texts in PROBES.items()}
    for name, (_, probe) in extra.items():
        summary[name] = probe
    (out / "voice_quality.json").write_text(
        json.dumps(
            {
                "summary": summary,
                "rows": rows,
                **{name: probe_rows for name, (probe_rows, _) in extra.items()},
                "voice": str(vdir),
            },
            indent=1,
        )
    )
    print(json.dumps(summary, indent=1))
    return summary


def _against_teacher(text: str, teacher: np.ndarray, voice: np.ndarray) -> dict:
    return {
        "text": text,
        "mcd_voice_db": quality.mcd(teacher, voice),
        "teacher_s": quality.speech_seconds(teacher),
        "voice_s": quality.speech_seconds(voice),
    }


def held_out_texts(corpus: dict, n: int, held_out_of: str = "") -> list[str]:
    """The first ``n`` held-out sentences of a voice's corpus (``voice.json``'s "corpus"),
    or of the ``held_out_of`` kind's corpus of the same size and seed, less any sentence
    the voice trained on."""
    kind = corpus.get("kind", "templates")  # voices from before the broad corpus
    own = sentences(corpus["sentences"], corpus["seed"], kind)
    texts = own[-corpus["held_out"] :]
    if held_out_of and held_out_of != kind:
        trained = set(own[: -corpus["held_out"]])
        other = sentences(corpus["sentences"], corpus["seed"], held_out_of)
        texts = [t for t in other[-corpus["held_out"] :] if t not in trained]
        print(f"held-out sentences of the {held_out_of} corpus, {len(texts)} not trained on")
    return texts[:n]


def _ratios(rows: list[dict]) -> np.ndarray:
    """Each row's speech duration, voice over teacher."""
    return np.array([r["voice_s"] / r["teacher_s"] for r in rows])


def _probe(synth, texts: tuple[str, ...]) -> tuple[list[dict], dict]:
    """Texts outside the corpus: each one's durations and MCD against the teacher."""
    rows: list[dict] = []
    for text in texts:
        teacher, _ = speak(text)
        r = _against_teacher(text, teacher, synth.synthesize(text).samples)
        rows.append(r)
        print(f"{text!r}: {r['voice_s']:.2f} s vs {r['teacher_s']:.2f} s", flush=True)
    ratio = _ratios(rows)
    return rows, {
        "texts": len(rows),
        "mcd_voice_db": float(np.mean([r["mcd_voice_db"] for r in rows])),
        "mcd_voice_db_median": float(np.median([r["mcd_voice_db"] for r in rows])),
        "duration_ratio_mean": float(ratio.mean()),
        "duration_ratio_max": float(ratio.max()),
        "duration_within_15pct": float(np.mean(np.abs(ratio - 1) <= DURATION_TARGET)),
    }


def _trained_codec(cfg, cls):
    work, _ = cfg.paths()
    ckpt = work / "codec" / "ckpt.pt"
    if not ckpt.is_file():
        print(f"no codec checkpoint at {ckpt}: resynthesis baseline skipped")
        return None
    codec = cls()
    codec.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=False)["model"])
    return codec.eval()


def _summary(rows: list[dict]) -> dict:
    voice = np.array([r["mcd_voice_db"] for r in rows])
    ratio = _ratios(rows)
    s = {
        "sentences": len(rows),
        "mcd_voice_db": float(voice.mean()),
        "duration_ratio_mean": float(ratio.mean()),
        "duration_within_15pct": float(np.mean(np.abs(ratio - 1) <= DURATION_TARGET)),
        "duration_abs_err_mean": float(np.mean(np.abs(ratio - 1))),
    }
    if all("mcd_resynth_db" in r for r in rows):
        resynth = np.array([r["mcd_resynth_db"] for r in rows])
        s["mcd_resynth_db"] = float(resynth.mean())
        s["mcd_gap_db"] = s["mcd_voice_db"] - s["mcd_resynth_db"]
        s["mcd_target_met"] = bool(s["mcd_gap_db"] <= MCD_TARGET_DB)
    s["duration_target_met"] = bool(s["duration_within_15pct"] == 1.0)  # every sentence
    return s
