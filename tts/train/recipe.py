"""``mmserve voice train``: the default voice from nothing, in resumable stages.

1. teacher: espeak-ng speaks ``sentences`` seeded sentences (``tts.train.corpus``);
2. codec: the frame codec learns to reconstruct that audio; every sentence is encoded;
3. backbone: a small Llama learns phoneme symbols -> codec frames (``tts.train.backbone``);
4. export: codec decoder + backbone + tokenizer as a voice directory (``out``).

Each stage leaves its result in ``work_dir`` and is skipped when it is there, and the two
training stages checkpoint as they go, so the same command resumes a killed or time-boxed
run. ``--stages`` runs a subset (e.g. only ``backbone,export`` on a GPU, from the codes a
CPU run made). The last ``held_out`` sentences are never trained on; the quality report
(``tts.quality``) scores them.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

STAGES = ("teacher", "codec", "backbone", "export")


@dataclass
class VoiceTrainConfig:
    work_dir: str = ""  # "": $MMSERVE_HOME/voice-train
    out: str = ""  # "": <work_dir>/voice
    stages: str = ",".join(STAGES)
    sentences: int = 48000
    corpus: str = "broad"  # broad | templates (tts.train.corpus.KINDS)
    held_out: int = 100
    seed: int = 0
    device: str = "auto"
    minutes: float = 0.0  # 0: no time limit; else stop (checkpointed) after this long
    codec_steps: int = 4000
    codec_batch: int = 16
    backbone_steps: int = 8000
    backbone_batch: int = 64
    backbone_size: str = "base"  # base | small (a CPU-sized model)
    backbone_lr: float = 1e-3
    backbone_dropout: float = 0.1  # residual-branch dropout while training
    backbone_init: str = ""  # a voice directory whose backbone the training starts from
    backbone_spans: int = 0  # >0: clause runs of at most this many phonemes also train
    backbone_valid: int = 200  # sentences before the held-out ones that pick the checkpoint
    backbone_valid_every: int = 250  # steps between validation passes
    threads: int = 0  # CPU threads for torch (0: leave torch's default)

    def __post_init__(self) -> None:
        unknown = set(self.stage_list) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; allowed: {', '.join(STAGES)}")
        from tts.train.corpus import KINDS

        if self.corpus not in KINDS:
            raise ValueError(f"unknown corpus {self.corpus!r}; allowed: {', '.join(KINDS)}")
        if self.held_out < 1 or self.sentences <= self.held_out:
            raise ValueError("need 1 <= held_out < sentences")
        if self.backbone_valid < 0 or self.sentences <= self.held_out + self.backbone_valid:
            raise ValueError("need 0 <= backbone_valid < sentences - held_out")

    @property
    def stage_list(self) -> list[str]:
        return [s for s in self.stages.split(",") if s]

    def paths(self) -> tuple[Path, Path]:
        from mmserve.models.hub import mmserve_home

        work = Path(self.work_dir) if self.work_dir else mmserve_home() / "voice-train"
        return work, Path(self.out) if self.out else work / "voice"


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def run(cfg: VoiceTrainConfig) -> int:
    """Run the asked stages; 0 when everything asked for is done, 3 when time ran out."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    work, out = cfg.paths()
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    device = resolve_device(cfg.device)
    deadline = time.time() + 60 * cfg.minutes if cfg.minutes else None
    stages = cfg.stage_list
    from tts.train.corpus import sentences

    texts = sentences(cfg.sentences, cfg.seed, cfg.corpus)
    _check_teacher(work / "teacher", texts)
    if "teacher" in stages:
        from tts.train.teacher import build

        build(texts, work / "teacher", workers=0)
    if "codec" in stages and not (work / "codes.npz").is_file():
        if not _codec_stage(cfg, work, device, deadline):
            return 3
    if "backbone" in stages and not (work / "backbone" / "final").is_dir():
        from tts.train.backbone import train_backbone

        if not train_backbone(cfg, work, device, deadline):
            return 3
    if "export" in stages:
        from tts.train.export import export_voice

        export_voice(
            work,
            out,
            corpus={
                "sentences": cfg.sentences,
                "held_out": cfg.held_out,
                "seed": cfg.seed,
                "kind": cfg.corpus,
            },
        )
        print(f"voice written to {out}", flush=True)
    return 0


def _check_teacher(path: Path, texts: list[str]) -> None:
    """A work directory's teacher data must be these sentences: every later stage reads
    it, and ``voice.json`` tells the quality report which sentences were held out."""
    if not (path / "done").is_file():
        return
    had = [item["text"] for item in json.loads((path / "index.json").read_text())]
    if had != texts:
        raise ValueError(
            f"{path} holds teacher data of other sentences than --corpus, --sentences and "
            "--seed draw; pass the settings it was built with, or another --work-dir"
        )


def _codec_stage(cfg: VoiceTrainConfig, work: Path, device: str, deadline: float | None) -> bool:
    from tts.train.codec_train import encode_all, train_codec
    from tts.train.teacher import Teacher

    teacher = Teacher(work / "teacher")
    train_items = list(range(len(teacher) - cfg.held_out))
    codec = train_codec(
        teacher,
        work / "codec",
        train_items,
        cfg.codec_steps,
        cfg.codec_batch,
        device=device,
        deadline=deadline,
    )
    if codec is None:
        return False
    codec.save(work / "codec" / "final")
    encode_all(codec, teacher, work / "codes.npz", device)
    return True
