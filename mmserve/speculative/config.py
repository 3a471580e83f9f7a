"""Speculative decoding settings (the shape of vLLM's ``--speculative-config``).

``SpecConfig.from_json('{"method": "ngram", "num_speculative_tokens": 4}')`` or a dict;
every field validates itself in ``__post_init__`` with a message saying what is allowed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

METHODS = ("ngram", "ngram_table", "draft_model", "self")
_ALIASES = {"model": "draft_model"}  # vLLM names the draft model "model"
_BUILD_HINT = "build one with `mmserve ngram build corpus.jsonl table.bin`"


@dataclass
class SpecConfig:
    """How to speculate.

    ``method``: ``ngram`` (prompt lookup in the request's own tokens), ``ngram_table``
    (a global table built offline, ``table_path``), ``draft_model`` (a small model,
    ``draft_model``) or ``self`` (the target's first ``self_draft_layers`` layers).
    ``num_speculative_tokens``: a fixed k, or ``"auto"`` for the controller to choose
    0..``k_max`` per request per step.
    """

    method: str = "ngram"
    num_speculative_tokens: int | str = "auto"
    k_max: int = 8  # upper bound for "auto"
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    table_path: str | None = None
    table_in_memory: bool = False  # False: memory-map the table (no RAM/GPU copy)
    draft_model: str | None = None  # name or local path
    self_draft_layers: int | None = None

    def __post_init__(self) -> None:
        _check(
            self.method in METHODS,
            f"method must be one of {', '.join(METHODS)}; got {self.method!r}",
        )
        self._check_num_tokens()
        _check(
            _is_int(self.k_max) and 1 <= self.k_max <= 64,
            f"k_max must be in 1..64, got {self.k_max!r}",
        )
        _check(
            _is_int(self.prompt_lookup_min) and self.prompt_lookup_min >= 1,
            f"prompt_lookup_min must be an integer >= 1, got {self.prompt_lookup_min!r}",
        )
        _check(
            _is_int(self.prompt_lookup_max) and self.prompt_lookup_max >= self.prompt_lookup_min,
            f"prompt_lookup_max must be an integer >= prompt_lookup_min "
            f"({self.prompt_lookup_min}), got {self.prompt_lookup_max!r}",
        )
        self._check_method_fields()

    @property
    def auto(self) -> bool:
        """Whether the controller chooses k per request per step."""
        return self.num_speculative_tokens == "auto"

    @property
    def max_tokens_per_step(self) -> int:
        """The largest k any step may draft (k_max for "auto", else the fixed k)."""
        return self.k_max if self.auto else int(self.num_speculative_tokens)

    @classmethod
    def from_json(cls, data: str | Mapping[str, Any]) -> SpecConfig:
        """Build from a JSON object string or a mapping; unknown keys are an error."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"speculative config is not valid JSON ({e.msg}); expected an object like "
                    '{"method": "ngram", "num_speculative_tokens": 4}'
                ) from None
        if not isinstance(data, Mapping):
            raise ValueError(f"speculative config must be a JSON object, got {type(data).__name__}")
        allowed = {f.name for f in fields(cls)}
        kwargs = {_ALIASES.get(key, key): value for key, value in data.items()}
        unknown = sorted(set(kwargs) - allowed)
        _check(
            not unknown, f"unknown speculative config keys {unknown}; allowed: {sorted(allowed)}"
        )
        return cls(**kwargs)

    def _check_num_tokens(self) -> None:
        k = self.num_speculative_tokens
        _check(
            k == "auto" or (_is_int(k) and 1 <= int(k) <= 64),
            f'num_speculative_tokens must be "auto" or an integer in 1..64, got {k!r} '
            "(to turn speculation off, leave the speculative config unset)",
        )

    def _check_method_fields(self) -> None:
        if self.method == "ngram_table":
            _check(
                self.table_path is not None, f"method 'ngram_table' needs table_path; {_BUILD_HINT}"
            )
            _check(
                Path(str(self.table_path)).is_file(),
                f"table_path {self.table_path!r} does not exist; {_BUILD_HINT}",
            )
        else:
            _check(self.table_path is None, "table_path is only used with method 'ngram_table'")
        if self.method == "draft_model":
            _check(
                bool(self.draft_model), "method 'draft_model' needs draft_model (a name or path)"
            )
        else:
            _check(self.draft_model is None, "draft_model is only used with method 'draft_model'")
        if self.method == "self":
            _check(
                _is_int(self.self_draft_layers) and int(self.self_draft_layers or 0) >= 1,
                f"method 'self' needs self_draft_layers >= 1 (the number of target layers the "
                f"drafter runs), got {self.self_draft_layers!r}",
            )
        else:
            _check(
                self.self_draft_layers is None, "self_draft_layers is only used with method 'self'"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
