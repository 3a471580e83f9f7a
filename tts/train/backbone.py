"""Stage 3 of ``mmserve voice train``: the backbone learns phoneme symbols -> codec frames.

Each teacher sentence becomes one sequence in the default voice's layout
(``tts.phoneme_voice``): the prompt, then per codec frame ``[Q_k, C_code]`` where ``k`` is
the phoneme espeak was speaking at the centre of the frame's window, then ``<eos>``.
The loss covers everything after ``<speech>``. ``lm_data.npz`` (built once from the
teacher's index and ``codes.npz``; a few MB) is all this stage reads, so it can run on
a machine without espeak-ng: carry that file and the codec.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tts.phoneme_voice import EOS, PAD, PhonemeVocab
from tts.text import Phonemized
from tts.train.llama import TrainLlama, llama_config
from tts.train.loop import train

NUM_Q = 256
HOP = 480


def build_lm_data(work: Path) -> Path:
    """``lm_data.npz``: every sentence's token sequence and where its loss starts."""
    out = work / "lm_data.npz"
    if out.is_file():
        return out
    t0 = time.perf_counter()
    index = json.loads((work / "teacher" / "index.json").read_text())
    with np.load(work / "codes.npz") as npz:  # each npz["..."] reads the file again
        all_codes, code_offsets = npz["codes"], npz["offsets"]
    symbols = sorted({s for it in index for s in it["symbols"]})
    vocab = PhonemeVocab(symbols, NUM_Q, _codebook(work))
    seqs, starts, offsets = [], [], [0]
    for i, it in enumerate(index):
        frames = all_codes[code_offsets[i] : code_offsets[i + 1]]
        seq, start = sequence(vocab, it, frames)
        seqs.append(seq)
        starts.append(start)
        offsets.append(offsets[-1] + len(seq))
    dtype = np.int16 if vocab.size < 2**15 else np.int32  # small enough to carry to a GPU
    np.savez_compressed(
        work / "lm_data.tmp.npz",
        tokens=np.concatenate(seqs).astype(dtype),
        offsets=np.array(offsets, np.int64),
        loss_from=np.array(starts, np.int64),
        symbols=np.array(vocab.symbols),
        num_q=NUM_Q,
        codebook=vocab.codebook,
    )
    (work / "lm_data.tmp.npz").replace(out)
    print(f"backbone: {len(seqs)} sequences built in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def _codebook(work: Path) -> int:
    cfg = json.loads((work / "codec" / "final" / "codec.json").read_text())
    return int(np.prod(cfg["levels"]))


def sequence(vocab: PhonemeVocab, item: dict, frames: np.ndarray) -> tuple[np.ndarray, int]:
    """One sentence's tokens and the index of its first predicted token."""
    ph = Phonemized(item["symbols"], item["is_phoneme"], item["starts"], item["length"])
    prompt = vocab.prompt(ph) if ph.num_phonemes <= vocab.num_q else []
    if not prompt or ph.num_phonemes == 0:
        return np.zeros(0, np.int64), 0
    centres = np.arange(len(frames)) * HOP + HOP
    ks = np.clip(
        np.searchsorted(np.array(item["starts"]), centres, side="right") - 1, 0, ph.num_phonemes - 1
    )
    body = np.stack([vocab.q_base + ks, vocab.code_base + frames.astype(np.int64)], 1)
    seq = np.concatenate([prompt, body.reshape(-1), [EOS]])
    return seq, len(prompt)


class LMData:
    """The sentences' token sequences: the last ``held_out`` are never used (the quality
    report's), the ``valid`` before them pick the checkpoint kept, the rest train. With
    ``spans`` > 0, each training and validation sentence also gives one run of its
    clauses of at most that many phonemes (``tts.train.spans``; drawn by a seeded choice),
    so short utterances are trained on and scored too."""

    def __init__(self, path: Path, held_out: int, valid: int = 0, spans: int = 0) -> None:
        d = np.load(path)
        tokens, offsets, loss_from = d["tokens"], d["offsets"], d["loss_from"]
        self.vocab = PhonemeVocab(list(d["symbols"]), int(d["num_q"]), int(d["codebook"]))
        n = len(offsets) - 1
        self.seqs = [tokens[offsets[i] : offsets[i + 1]] for i in range(n)]
        self.loss_from = [int(x) for x in loss_from]
        end = n - held_out - valid
        train = [i for i in range(end) if len(self.seqs[i]) > 0]
        held = [i for i in range(end, n - held_out) if len(self.seqs[i]) > 0]
        if spans > 0:
            train += self._add_spans(train, spans)
            held += self._add_spans(held, spans)
        self.by_length = sorted(train, key=lambda i: len(self.seqs[i]))  # for bucketing
        self.valid = sorted(held, key=lambda i: len(self.seqs[i]))

    def _add_spans(self, sentences: list[int], max_phonemes: int) -> list[int]:
        from tts.train.spans import clause_spans

        added = []
        for i in sentences:
            got = clause_spans(
                self.seqs[i].astype(np.int64), self.loss_from[i], self.vocab, max_phonemes
            )
            if got:
                tokens, start = got[int(np.random.default_rng([13, i]).integers(len(got)))]
                added.append(len(self.seqs))
                self.seqs.append(tokens.astype(self.seqs[i].dtype))
                self.loss_from.append(start)
        return added

    def _pack(self, pick: list[int], device: str) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = [self.seqs[i] for i in pick]
        t = max(len(s) for s in seqs)
        ids = np.full((len(pick), t), PAD, np.int64)
        mask = np.zeros((len(pick), t), np.float32)
        for b, (i, s) in enumerate(zip(pick, seqs, strict=True)):
            ids[b, : len(s)] = s
            mask[b, self.loss_from[i] : len(s)] = 1.0  # targets: after <speech>, to <eos>
        return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)

    def valid_batches(self, size: int, device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [
            self._pack(self.valid[a : a + size], device) for a in range(0, len(self.valid), size)
        ]

    def batch(
        self, rng: np.random.Generator, size: int, device: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids (B, T), loss mask (B, T)) for ``size`` random training sentences of about
        the same length (neighbours in length order: little padding)."""
        at = int(rng.integers(0, len(self.by_length) - size + 1))
        return self._pack(self.by_length[at : at + size], device)


def train_backbone(cfg, work: Path, device: str, deadline: float | None) -> bool:
    data = LMData(build_lm_data(work), cfg.held_out, cfg.backbone_valid, cfg.backbone_spans)
    torch.manual_seed(cfg.seed)
    mcfg = llama_config(cfg.backbone_size, data.vocab.size)
    model = TrainLlama(mcfg, cfg.backbone_dropout)
    if cfg.backbone_init:
        init_backbone(model, Path(cfg.backbone_init), data.vocab)
    model = model.to(device)
    autocast = torch.autocast("cuda", torch.bfloat16) if device == "cuda" else None

    def losses(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss over the masked targets, their count)."""
        if autocast is not None:
            with autocast:
                logits = model(ids[:, :-1])
        else:
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        m = mask[:, 1:].reshape(-1)
        return (loss * m).sum(), m.sum()

    def step_fn(step: int) -> torch.Tensor:
        total, count = losses(
            # a run from another voice's weights draws its own batch order
            *data.batch(
                np.random.default_rng([12 if cfg.backbone_init else 11, step]),
                cfg.backbone_batch,
                device,
            )
        )
        return total / count

    valid = data.valid_batches(cfg.backbone_batch, device) if data.valid else []

    @torch.no_grad()
    def valid_loss() -> float:
        model.eval()
        got = [losses(ids, mask) for ids, mask in valid]
        model.train()
        return float(sum(t for t, _ in got) / sum(c for _, c in got))

    steps = cfg.backbone_steps or fit_steps(model, step_fn, deadline, work / "backbone")
    if not train(
        "backbone",
        work / "backbone",
        model,
        step_fn,
        steps,
        cfg.backbone_lr,
        warmup=min(500, steps // 10),
        deadline=deadline,
        evaluate=valid_loss if valid else None,
        eval_every=cfg.backbone_valid_every,
    ):
        return False
    save_backbone(model, mcfg, data.vocab, work / "backbone" / "final")
    return True


def init_backbone(model: TrainLlama, voice: Path, vocab: PhonemeVocab) -> None:
    """Start from a voice's backbone (``--backbone-init``: train on from a shipped voice,
    whose optimizer state is gone, with a fresh schedule). Its symbols, pointer and code
    ranges must be this corpus's, and every tensor's name and shape the model's."""
    from safetensors.torch import load_file

    meta = json.loads((voice / "voice.json").read_text())
    got = PhonemeVocab(list(meta["symbols"]), int(meta["num_q"]), int(meta["codebook"]))
    if got.names() != vocab.names():
        raise ValueError(f"{voice} has another vocabulary than this corpus: it cannot start it")
    weights = load_file(str(voice / "model.safetensors"))
    own = model.state_dict()
    if {k: tuple(v.shape) for k, v in weights.items()} != {
        k: tuple(v.shape) for k, v in own.items()
    }:
        raise ValueError(f"{voice}'s backbone has another shape than --backbone-size's")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in weights.items()})


def fit_steps(
    model: TrainLlama, step_fn, deadline: float | None, work: Path, probe: int = 20
) -> int:
    """``--backbone-steps 0``: as many steps as fit before ``deadline`` (a 5 % margin),
    from the time of ``probe`` forward/backward passes that update nothing (after 3 to warm
    up). The count is fixed before training starts and kept in ``steps.json``, so the
    schedule is a pure function of the step and a resumed run keeps it."""
    import time

    saved = work / "steps.json"
    if saved.is_file():
        return int(json.loads(saved.read_text())["steps"])
    if deadline is None:
        raise ValueError("backbone_steps 0 (fit the time) needs --minutes")
    sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)
    for i in range(3 + probe):
        if i == 3:
            sync()
            t = time.time()
        step_fn(10**9 + i).backward()
    sync()  # the launches return before the device is done: time the work, not the queue
    model.zero_grad(set_to_none=True)
    per_step = (time.time() - t) / probe * 1.1  # the optimizer's share
    steps = max(100, int(0.95 * (deadline - time.time()) / per_step))
    print(f"backbone: {per_step * 1000:.1f} ms a step -> {steps} steps fit", flush=True)
    work.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps({"steps": steps, "ms_per_step": 1000 * per_step}))
    return steps


def save_backbone(model: TrainLlama, mcfg: dict, vocab: PhonemeVocab, out: Path) -> None:
    """An HF-layout model directory the engine loads (float16 safetensors, tokenizer)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.float16).cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(mcfg, indent=1))
    (out / "tokenizer.json").write_text(vocab.tokenizer_json())
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"})
    )
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": PAD})
    )
    (out / "vocab.json").write_text(
        json.dumps({"symbols": vocab.symbols, "num_q": vocab.num_q, "codebook": vocab.codebook})
    )
