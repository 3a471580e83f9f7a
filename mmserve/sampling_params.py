"""Per-request sampling settings (the vLLM ``SamplingParams`` shape)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmserve.structured.spec import StructuredOutput


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature=0`` is greedy."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = 256  # None: up to the context length
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # number of top logprobs per token; 0 = only the sampled one
    skip_special_tokens: bool = True
    # False: token ids only, no text (a voice's audio tokens); stop strings need the text
    detokenize: bool = True
    # constrain the output to a JSON schema, regex, choice, grammar or tool-call markup
    # (plain data: the engine compiles it); see docs/structured-output.md
    structured: StructuredOutput | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, [-100, 100]

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.top_k == -1:
            self.top_k = 0
        _check(self.n >= 1, f"n must be >= 1, got {self.n}")
        _check(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= 0, f"top_k must be >= 0 (or -1 for off), got {self.top_k}")
        _check(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        _check(
            -2.0 <= self.presence_penalty <= 2.0,
            f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
        )
        _check(
            -2.0 <= self.frequency_penalty <= 2.0,
            f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
        )
        _check(
            self.max_tokens is None or self.max_tokens >= 1,
            f"max_tokens must be >= 1, got {self.max_tokens}",
        )
        _check(self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}")
        _check(
            self.logprobs is None or 0 <= self.logprobs <= 20,
            f"logprobs must be between 0 and 20, got {self.logprobs}",
        )
        _check(all(s for s in self.stop), "stop strings must be non-empty")
        _check(self.detokenize or not self.stop, "stop strings need detokenize=True")
        _check(
            self.structured is None or isinstance(self.structured, StructuredOutput),
            "structured must be a StructuredOutput",
        )
        if self.structured is not None:
            # a grammar decides where the output may end: EOS is its end
            _check(not self.ignore_eos, "ignore_eos cannot be combined with structured output")
            _check(
                self.min_tokens == 0,
                "min_tokens cannot be combined with structured output (the grammar "
                "decides where the output ends)",
            )
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            _check(
                all(-100.0 <= v <= 100.0 for v in self.logit_bias.values()),
                "logit_bias values must be in [-100, 100]",
            )
            _check(all(k >= 0 for k in self.logit_bias), "logit_bias keys must be token ids")
            self.logit_bias = self.logit_bias or None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
