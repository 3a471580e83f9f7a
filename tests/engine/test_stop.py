"""Stop-string tests: streamed detection and holding back equal non-streaming truncation."""

from __future__ import annotations

import random

import pytest

from mmserve.engine.stop import StopChecker, StopResult


def _stream(checker: StopChecker, chunks: list[str]) -> tuple[str, StopResult | None]:
    """What a client sees: text released by ``safe_len`` each step, truncated at the stop."""
    text, sent = "", ""
    for chunk in chunks:
        text += chunk
        res = checker.check(text, len(chunk))
        if res.stopped:
            assert res.truncate_to is not None and res.truncate_to >= len(sent)
            return sent + text[len(sent) : res.truncate_to], res
        safe = checker.safe_len(text)
        assert safe >= len(sent)
        sent += text[len(sent) : safe]
    return sent + text[len(sent) :], None


def _whole(checker: StopChecker, text: str) -> str:
    res = checker.check(text, len(text))
    return text[: res.truncate_to] if res.stopped else text


def test_split_across_tokens() -> None:
    out, res = _stream(StopChecker(["</answer>"]), ["The x", "</an", "sw", "er> tail"])
    assert out == "The x" and res == StopResult(True, "</answer>", 5)


def test_stop_at_very_start() -> None:
    assert _stream(StopChecker(["STOP"]), ["ST", "OP more"]) == ("", StopResult(True, "STOP", 0))
    assert StopChecker(["STOP"], True).check("STOP", 4) == StopResult(True, "STOP", 4)


def test_include_stop_str_in_output() -> None:
    checker = StopChecker(["\n\n"], include_stop_str_in_output=True)
    out, res = _stream(checker, ["a\n", "\nb"])
    assert out == "a\n\n" and res is not None and res.truncate_to == 3
    assert checker.safe_len("abc\n") == 4  # nothing to hold back when the stop is kept


def test_overlapping_stop_strings_first_to_end_wins() -> None:
    checker = StopChecker(["abcd", "bc", "xyz"])
    assert checker.check("zabcd", 5) == StopResult(True, "bc", 2)
    same_end = StopChecker(["bc", "abc"])
    assert same_end.check("zabc", 4) == StopResult(True, "abc", 1)
    assert _stream(checker, ["za", "bcd"])[0] == _whole(checker, "zabcd") == "za"


def test_holding_back_prefixes() -> None:
    checker = StopChecker(["###", "<end>"])
    assert checker.safe_len("hello") == 5
    assert checker.safe_len("hello#") == 5
    assert checker.safe_len("hello##") == 5
    assert checker.safe_len("hello<en") == 5
    assert checker.safe_len("hello<x") == 7
    assert checker.safe_len("<e") == 0
    assert StopChecker([]).safe_len("abc") == 3 and not StopChecker([]).check("abc", 3).stopped


def test_search_is_limited_to_tail() -> None:
    checker = StopChecker(["STOP"])
    # an old occurrence outside the tail region is not re-reported
    assert not checker.check("STOP" + "x" * 10, 3).stopped
    assert checker.check("x" * 10 + "STOP", 1).stopped


@pytest.mark.parametrize("include", [False, True])
def test_streaming_equals_non_streaming(include: bool) -> None:
    rng = random.Random(1)
    alphabet = "ab<>/ \n"
    for _ in range(2000):
        stops = [
            "".join(rng.choices(alphabet, k=rng.randint(1, 4))) for _ in range(rng.randint(1, 3))
        ]
        checker = StopChecker(stops, include)
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 30)))
        chunks, pos = [], 0
        while pos < len(text):
            n = rng.randint(1, 5)
            chunks.append(text[pos : pos + n])
            pos += n
        assert _stream(checker, chunks)[0] == _whole(checker, text), (stops, chunks)


def test_megabyte_stop_string_costs_linear_memory() -> None:
    """Every prefix of every stop string was once stored: 1 MB of 'a' took 21 GB."""
    import tracemalloc

    stop = "a" * 1_000_000
    tracemalloc.start()
    checker = StopChecker([stop, "ab"])
    text = "x" * 100 + "a" * 5000
    held = checker.safe_len(text)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert held == 100  # the run of a's could still become the stop string
    assert peak < 8 * len(stop)
    assert checker.check(text + "b", 1) == StopResult(True, "ab", 5099)
