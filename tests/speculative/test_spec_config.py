"""SpecConfig validation and JSON parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmserve.speculative.config import SpecConfig
from mmserve.speculative.ngram_build import build_table


def test_defaults_and_json() -> None:
    cfg = SpecConfig()
    assert (cfg.method, cfg.auto, cfg.max_tokens_per_step) == ("ngram", True, 8)
    cfg = SpecConfig.from_json(
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
    )
    assert (cfg.auto, cfg.max_tokens_per_step, cfg.prompt_lookup_max) == (False, 4, 3)
    cfg = SpecConfig.from_json({"method": "draft_model", "model": "smollm2-135m"})  # vLLM alias
    assert cfg.draft_model == "smollm2-135m"
    assert SpecConfig.from_json({"method": "self", "self_draft_layers": 4}).self_draft_layers == 4


def test_ngram_table_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs table_path.*mmserve ngram build"):
        SpecConfig(method="ngram_table")
    with pytest.raises(ValueError, match="does not exist.*mmserve ngram build"):
        SpecConfig(method="ngram_table", table_path=str(tmp_path / "missing.bin"))
    build_table([[1, 2, 3, 4, 5]] * 2, tmp_path / "t.bin")
    cfg = SpecConfig(method="ngram_table", table_path=str(tmp_path / "t.bin"), table_in_memory=True)
    assert cfg.table_in_memory


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "eagle"}, "method must be one of ngram, ngram_table, draft_model, self"),
        ({"num_speculative_tokens": 0}, "to turn speculation off"),
        ({"num_speculative_tokens": "many"}, 'must be "auto" or an integer'),
        ({"num_speculative_tokens": True}, 'must be "auto" or an integer'),
        ({"k_max": 0}, "k_max must be in 1..64"),
        ({"prompt_lookup_min": 0}, "prompt_lookup_min must be an integer >= 1"),
        ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max must be .* >= "),
        ({"method": "draft_model"}, "needs draft_model"),
        ({"method": "self"}, "needs self_draft_layers >= 1"),
        ({"method": "self", "self_draft_layers": 0}, "needs self_draft_layers >= 1"),
        ({"table_path": "t.bin"}, "only used with method 'ngram_table'"),
        ({"draft_model": "x"}, "only used with method 'draft_model'"),
        ({"self_draft_layers": 2}, "only used with method 'self'"),
    ],
)
def test_invalid_values_say_what_is_allowed(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpecConfig(**kwargs)


def test_from_json_errors() -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        SpecConfig.from_json("{method: ngram}")
    with pytest.raises(ValueError, match="must be a JSON object"):
        SpecConfig.from_json("[1, 2]")
    with pytest.raises(ValueError, match=r"unknown speculative config keys \['speculative_k'\]"):
        SpecConfig.from_json({"speculative_k": 3})
