"""The default voice's parts: the frame codec streams what it decodes whole, text splits
where speech pauses, the training Llama is HF's Llama, and ``mmserve voice train`` runs
end to end at toy scale into a voice the engine speaks with."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tts.framecodec import FrameCodec, FrameCodecConfig
from tts.text import phonemize, split_clauses


def test_frame_codec_streaming_equals_whole():
    torch.manual_seed(0)
    codec = FrameCodec(FrameCodecConfig(dec_dim=32, enc_dim=32)).eval()
    codes = torch.randint(0, codec.codebook_size, (2, 23, 1))
    whole = codec.decode(codes).numpy()
    state = codec.init_state(2)
    parts = [codec.step(codes[:, a:b], state).rows() for a, b in ((0, 1), (1, 8), (8, 23))]
    stream = np.stack([np.concatenate([p[r] for p in parts]) for r in range(2)])
    assert codec.lookahead_frames == 0 and stream.shape == whole.shape == (2, 23 * 480)
    assert np.abs(stream - whole).max() <= codec.tolerance
    assert codec.flush(state).rows()[0].size == 0  # causal: nothing was held back


def test_split_clauses_keeps_every_word_and_the_limit():
    text = (
        "Short one. "
        + "A long clause, with commas, that goes on and on; " * 6
        + "Supercalifragilisticexpialidocious" * 3
        + " end?"
    )
    pieces = split_clauses(text, 60)
    assert all(len(p) <= 60 for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    assert pieces[0] == "Short one."


def test_split_clauses_keeps_short_sentences_together():
    """A piece is an utterance of its own (edge silence included): short sentences share
    one, as the voice's teacher speaks them, up to the piece limit."""
    assert split_clauses("Smooth! Anna nearly repaired her thunder!") == [
        "Smooth! Anna nearly repaired her thunder!"
    ]
    text = "One two three. Four five six? Seven eight nine! Ten eleven twelve."
    pieces = split_clauses(text, 32)
    assert pieces == ["One two three. Four five six?", "Seven eight nine!", "Ten eleven twelve."]


def test_one_sentence_a_piece_keeps_abbreviations_inside_their_sentence():
    text = "Dr. Smith is here. Mr. Jones left at 3 p.m. today. No. See e.g. the map!"
    assert split_clauses(text, 160, join_sentences=False) == [
        "Dr. Smith is here.",
        "Mr. Jones left at 3 p.m. today.",
        "No.",
        "See e.g. the map!",
    ]


def test_phonemes_mark_words_and_clause_punctuation():
    ph = phonemize("Yes, it is. Is it?")
    assert ph.num_phonemes == sum(ph.is_phoneme) > 5
    assert [s for s in ph.symbols if s in ",.?"] == [",", ".", "?"]
    assert "|" in ph.symbols
    # espeak reads a C string: a NUL (any control character) is a space, not the end
    assert phonemize("Hi\x00there. Is\x07it?").symbols == phonemize("Hi there. Is it?").symbols


def test_training_llama_is_hf_llama():
    transformers = pytest.importorskip("transformers")
    from tts.train.llama import TrainLlama, llama_config

    cfg = llama_config("small", 300) | {
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 256,
    }
    torch.manual_seed(0)
    ours = TrainLlama(cfg).eval()
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    hf.load_state_dict(ours.state_dict(), strict=False)
    hf.tie_weights()
    ids = torch.randint(0, 300, (2, 17))
    with torch.no_grad():
        assert torch.allclose(ours(ids), hf(ids).logits.float(), atol=1e-4)


def test_voice_train_end_to_end_at_toy_scale(tmp_path, capsys):
    from mmserve.cli import main
    from tts.synthesizer import Synthesizer

    work = tmp_path / "work"
    argv = [
        "voice",
        "train",
        "--work-dir",
        str(work),
        "--sentences",
        "6",
        "--held-out",
        "2",
        "--backbone-valid",
        "1",
        "--codec-steps",
        "2",
        "--codec-batch",
        "2",
        "--backbone-steps",
        "2",
        "--backbone-batch",
        "2",
        "--backbone-size",
        "tiny",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    assert main(argv) == 0  # every stage done: resumes to nothing
    assert (work / "backbone" / "best.pt").is_file()  # the validation-picked weights
    voice = work / "voice"
    assert (voice / "voice.json").is_file() and (voice / "codec" / "codec.json").is_file()
    synth = Synthesizer(str(voice), device="cpu", kv_cache_memory_mb=16)
    synth.voice.frames_per_phoneme, synth.voice.frame_slack = 1, 1  # untrained: bound it
    audio = synth.synthesize("Hi.")
    assert audio.sample_rate == 24000 and len(audio.samples) % 480 == 0

    # --backbone-init: a new backbone run starts from the exported voice's weights (at
    # learning rate 0 it ends with them, bit for bit)
    import shutil

    from safetensors.torch import load_file

    shutil.rmtree(work / "backbone")
    again = tmp_path / "voice2"
    init = ["--backbone-init", str(voice), "--backbone-lr", "0", "--out", str(again)]
    assert main([*argv, "--stages", "backbone,export", *init]) == 0
    first, second = load_file(voice / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)

    # the work directory's teacher data was drawn from the broad corpus (the default):
    # another corpus is refused before any stage runs, not trained on the wrong sentences
    assert json.loads((voice / "voice.json").read_text())["corpus"]["kind"] == "broad"
    assert main([*argv, "--corpus", "templates"]) != 0
    assert "holds teacher data of other sentences" in capsys.readouterr().err
    assert json.loads((voice / "voice.json").read_text())["corpus"]["kind"] == "broad"


def test_clause_stream_pieces_do_not_depend_on_chunking():
    import random

    from tts.text import ClauseStream

    text = (
        "Well, I think so. The answer, as far as I can tell, is 42; or maybe not! "
        "Here is a very long run of words without any punctuation at all that keeps "
        "going and going until it must be cut somewhere sensible - then it ends."
    )

    def pieces(chunks: list[str]) -> list[str]:
        cs = ClauseStream(min_chars=15, max_chars=60)
        out = [p for c in chunks for p in cs.feed(c)]
        return out + cs.flush()

    whole = pieces([text])
    assert all(len(p) <= 60 for p in whole) and whole[0] == "Well, I think so."
    assert " ".join(whole).split() == text.split()
    rng = random.Random(0)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), 12))
        bounds = zip([0, *cuts], [*cuts, len(text)], strict=True)
        assert pieces([text[a:b] for a, b in bounds]) == whole


def test_training_keeps_the_picked_weights_and_ignores_a_stale_best(tmp_path):
    """A validating run ends with the weights it picked; ``best.pt`` is that run's
    choice, and a run that does not validate (in a work directory a validating run left)
    ends with its own last weights."""
    from tts.train.loop import train

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    def step_fn(_: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(x), y)

    scores = iter([1.0, 0.0, 1.0])  # steps 0 (the starting weights), 2 and 4: 2 wins

    def evaluate() -> float:
        return next(scores)

    seen: dict[int, dict] = {}

    def log(step: int, _: float) -> None:
        seen[step] = {k: v.clone() for k, v in model.state_dict().items()}

    assert train(
        "t",
        tmp_path,
        model,
        step_fn,
        4,
        1e-2,
        warmup=0,
        log_every=1,
        on_log=log,
        evaluate=evaluate,
        eval_every=2,
    )
    picked = {k: v.clone() for k, v in model.state_dict().items()}
    # the run ends with the weights validation picked (step 2's), not its last (step 4's)
    assert all(torch.equal(picked[k], seen[2][k]) for k in picked)
    assert not all(torch.equal(picked[k], seen[4][k]) for k in picked)
    (tmp_path / "ckpt.pt").unlink()  # a fresh run in the same directory, no validation
    torch.manual_seed(1)
    model.reset_parameters()
    assert train("t", tmp_path, model, step_fn, 6, 1e-2, warmup=0)
    last = model.state_dict()
    assert not all(torch.equal(picked[k], last[k]) for k in picked)


def test_a_piece_ends_where_the_pointer_runs_past_its_phonemes():
    """The shipped backbone loses its place on a word its sentence repeats ("seventy
    three point seventy five") and points past the last phoneme: those frames speak no
    text, so the piece ends there (a stop token) instead of babbling on to ``<eos>``."""
    from tts.phoneme_voice import EOS
    from tts.synthesizer import Synthesizer

    synth = Synthesizer(None, device="cpu", kv_cache_memory_mb=32)
    voice, lay = synth.voice, synth.voice.layout
    (prompt,) = voice.prompts("Nadia and Sam met at the factory at 73.75.")
    phonemes = sum(lay.is_q(t) for t in prompt)
    params = voice.sampling(prompt)
    overrun = range(lay.q_base + phonemes, lay.q_base + lay.num_q)
    assert set(params.stop_token_ids) == {*overrun, EOS}
    synth.engine.add_request(prompt, params, "p")
    out = None
    while out is None:
        out = next((o for o in synth.engine.step() if o.request_id == "p" and o.finished), None)
    # a reply shorter than the teacher's sentences keeps only <eos>: its pointer is not
    # anchored, and stopping at its first overrun would leave it silent
    (short,) = voice.prompts("Hello there.")
    assert voice.sampling(short).stop_token_ids == [EOS]
    *body, last = out.token_ids
    pointers = [t - lay.q_base for t in body if lay.is_q(t)]
    assert pointers and max(pointers) == phonemes - 1  # without the rule: 61
    assert pointers == sorted(pointers)  # the pointer never goes back
    assert last in (EOS, lay.q_base + phonemes)  # ended by <eos> or the first overrun


def test_the_shipped_voice_speaks_every_sentence_of_a_reply():
    """Given two sentences in one utterance the shipped backbone ended it at the first
    one's end (0.23-0.65 of the teacher's length here); one sentence a piece, each reply
    lasts as long as espeak-ng (its teacher) speaks it."""
    from tts.espeak import Espeak
    from tts.quality import speech_seconds
    from tts.synthesizer import Synthesizer

    synth = Synthesizer(None, device="cpu", kv_cache_memory_mb=32)
    for text in (
        "Thanks for calling. How can I help you today?",
        "Please hold on. I am checking the system now.",
        "I have 3 apples. The quick brown fox jumps over the lazy dog.",
        "Your order has shipped. It should arrive on Monday. Is there anything else?",
    ):
        assert len(synth.voice.prompts(text)) == text.count(".") + text.count("?")
        teacher, _ = Espeak.get().synthesize(text)
        ratio = speech_seconds(synth.synthesize(text).samples) / speech_seconds(teacher)
        assert 0.8 <= ratio <= 1.25, (text, ratio)
