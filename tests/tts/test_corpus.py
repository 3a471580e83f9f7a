"""The teacher corpus: both kinds are seeded and stable, the broad one reaches far more
English than the templates, and no kind ever draws a quality-report probe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tts.train import corpus
from tts.train import words as W
from tts.train.probes import PROBE_TEXTS, UNSEEN_WORDS
from tts.train.recipe import VoiceTrainConfig

N = VoiceTrainConfig().sentences  # the held-out and probe claims are about this corpus
SHIPPED = Path(__file__).resolve().parents[2] / "tts" / "voices" / "default" / "voice.json"


def _words(texts) -> set[str]:
    return {w for t in texts for w in re.findall(r"[a-z']+", t.lower())}


@pytest.fixture(scope="module")
def drawn() -> dict[str, list[str]]:
    return {kind: corpus.sentences(N, 0, kind) for kind in corpus.KINDS}


def test_kinds_are_seeded_distinct_and_free_of_probes(drawn):
    for kind, texts in drawn.items():
        assert len(set(texts)) == N
        assert not PROBE_TEXTS & set(texts), kind
        assert corpus.sentences(200, 0, kind) == corpus.sentences(200, 0, kind)
        assert corpus.sentences(200, 1, kind) != texts[:200]
    with pytest.raises(ValueError, match="allowed: templates, broad"):
        corpus.sentences(10, 0, "poetry")


def test_the_shipped_voice_was_trained_on_the_default_corpus(drawn):
    # its held-out sentences are re-drawn from voice.json's corpus settings, so a change
    # to the corpus code must not move them (two of them, as the quality report prints them)
    meta = json.loads(SHIPPED.read_text())["corpus"]
    cfg = VoiceTrainConfig()
    assert (meta["kind"], meta["sentences"], meta["seed"]) == (cfg.corpus, N, cfg.seed)
    held_out = drawn["broad"][-meta["held_out"] :]
    assert "I can mind the county for you." in held_out
    assert "Please bring needle, tunnel, kettle, and blanket." in held_out
    # a voice.json without "kind" (the voices before the broad corpus) re-draws templates,
    # which draw as they did for the 36,000-sentence template voice
    templates = corpus.sentences(36000, 0, "templates")[-100:]
    assert "Ravi and Zoe met at the museum at 94,047." in templates
    assert "Nadia and Sam met at the factory at 73.75." in templates


def test_broad_reaches_far_more_words_and_short_replies(drawn):
    templates, broad = _words(drawn["templates"]), _words(drawn["broad"])
    assert len(broad) > 4 * len(templates)

    # short utterances: the templates have almost none, the broad corpus thousands
    def short(texts):
        return sum(len(t.split()) <= 3 for t in texts)

    assert short(drawn["templates"]) < 50
    assert short(drawn["broad"]) > 3000  # of 48,000


def test_unseen_words_probe_is_unseen_by_every_kind(drawn):
    function_words = {"a", "an", "the", "our", "for", "by", "near", "with"}
    seen = set().union(*(_words(texts) for texts in drawn.values()))
    for text in UNSEEN_WORDS:
        content = _words([text]) - function_words
        assert content and not content & seen, (text, content & seen)


def test_word_forms():
    assert W.verb_forms("stop") == ("stop", "stops", "stopped", "stopped")
    assert W.verb_forms("carry") == ("carry", "carries", "carried", "carried")
    assert W.verb_forms("begin:began:begun") == ("begin", "begins", "began", "begun")
    assert W.verb_forms("prefer:preferred")[2:] == ("preferred", "preferred")
    assert [W.ing(v) for v in ("make", "run", "lie", "agree", "forget", "visit")] == [
        "making", "running", "lying", "agreeing", "forgetting", "visiting",
    ]  # fmt: skip
    assert [W.plural(n) for n in ("city", "box", "knife", "day")] == [
        "cities", "boxes", "knives", "days",
    ]  # fmt: skip
    assert [W.article(w) for w in ("hour", "user", "apple", "house")] == ["an", "a", "an", "a"]
    for lst in (W.NOUNS, W.ADJECTIVES, W.VERBS, W.ADVERBS, W.NAMES, W.SHORT):
        assert len(lst) == len(set(lst))


def test_held_out_of_another_kind_leaves_out_what_the_voice_trained_on(drawn):
    from tts.train.evaluate import held_out_texts

    meta = {"sentences": N, "held_out": 100, "seed": 0}  # a voice.json without "kind"
    assert held_out_texts(meta, 24) == drawn["templates"][-100:][:24]
    cross = held_out_texts(meta, 100, held_out_of="broad")
    trained = set(drawn["templates"][:-100])
    assert cross and not set(cross) & trained
    assert set(cross) <= set(drawn["broad"][-100:])
    assert len(cross) == sum(t not in trained for t in drawn["broad"][-100:])
    broad_meta = {**meta, "kind": "broad"}
    assert held_out_texts(broad_meta, 5) == drawn["broad"][-100:][:5]
