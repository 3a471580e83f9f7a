"""Pydantic request models of the OpenAI HTTP API (the subset mmserve serves).

Models are strict (``"5"`` is not an int, ``true`` is not a number) so a wrong
type is a 400 naming the parameter. Fields that change nothing mmserve returns
(``store``, ``metadata``, ``service_tier``, ...) are accepted and ignored, as OpenAI-
compatible servers do; a field that would change the output and that mmserve does not
implement (``best_of``, ``prompt_logprobs``, vLLM's removed ``guided_*``, ...) is a 400
naming it, never silently dropped (``UNSUPPORTED``). ``to_sampling_params`` is where
request fields map onto ``SamplingParams``.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mmserve.sampling_params import SamplingParams
from mmserve.server.errors import ParamError
from mmserve.structured.spec import StructuredOutput

MAX_N = 16

# fields OpenAI or vLLM clients send that would change the output and that mmserve does
# not implement -> what to say (a value of None/default is accepted: it asks for nothing)
UNSUPPORTED: dict[str, str] = {
    "best_of": "best_of is not supported; use n and pick on the client",
    "prompt_logprobs": "prompt_logprobs is not supported (the prefill keeps only its last "
    "row's logits)",
    "use_beam_search": "beam search is not supported",
    "length_penalty": "length_penalty (beam search) is not supported",
    "repetition_penalty": "repetition_penalty is not supported; use presence_penalty or "
    "frequency_penalty",
    "bad_words": "bad_words is not supported; use logit_bias",
    "allowed_token_ids": "allowed_token_ids is not supported; use logit_bias or structured_outputs",
    "logits_processors": "logits_processors is not supported",
    "truncate_prompt_tokens": "truncate_prompt_tokens is not supported",
    "prediction": "predicted outputs (prediction) are not supported",
    "functions": "functions is not supported; use tools",
    "function_call": "function_call is not supported; use tool_choice",
    "web_search_options": "web_search_options is not supported",
    "audio": "audio output is not supported on this endpoint; use /v1/audio/speech",
    "guided_json": "guided_json was removed (as in vLLM); use structured_outputs.json",
    "guided_regex": "guided_regex was removed (as in vLLM); use structured_outputs.regex",
    "guided_choice": "guided_choice was removed (as in vLLM); use structured_outputs.choice",
    "guided_grammar": "guided_grammar was removed (as in vLLM); use structured_outputs.grammar",
    "guided_decoding_backend": "guided_decoding_backend is not supported (the backend is xgrammar)",
    "guided_whitespace_pattern": "guided_whitespace_pattern is not supported",
    "chat_template": "a per-request chat_template is not supported; the served model's "
    "template is used",
    "chat_template_kwargs": "chat_template_kwargs is not supported; the served model's "
    "template is rendered with messages and tools only",
    "add_generation_prompt": "add_generation_prompt=false is not supported; the assistant "
    "turn is always opened",
    "continue_final_message": "continue_final_message is not supported; use "
    "/v1/completions with the rendered prompt",
    "echo": "echo is not supported on chat completions; use /v1/completions",
    "reasoning_effort": "reasoning_effort is not supported (the chat template does not receive it)",
    "modalities": "only the text modality is served here; spoken answers are on "
    "/v1/realtime and /v1/audio/speech",
}
# values that ask for nothing beyond the default, where that is not null/false/empty
_DEFAULTS: dict[str, Any] = {"best_of": 1, "add_generation_prompt": True, "modalities": ["text"]}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Open(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class ImageURL(_Open):
    url: str
    detail: str | None = None


class ContentPart(_Open):
    """A content part: text (``text``/``input_text``) or an image (``image_url``)."""

    type: str
    text: str | None = None
    image_url: ImageURL | None = None


class FunctionCall(_Strict):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI ``response_format``: text (free), any JSON object, or a JSON schema (always
    enforced strictly: the grammar admits only documents the schema accepts)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs`` extra (exactly one of its fields)."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None


class _SamplingFields(_Open):
    """Fields shared by chat and text completions (OpenAI names; extras from vLLM). Extra
    fields are kept (``model_extra``) so ``refuse_unsupported`` can name them."""

    model: str | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1 - MAX_N)  # torch's range
    stop: str | list[str] | None = None  # count and length: ServerConfig (limits.check_stop)
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False  # vLLM extras the engine implements
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return v

    @abstractmethod
    def requested_max_tokens(self) -> int | None:
        """The client's token limit under this endpoint's field name(s), if any."""

    @abstractmethod
    def num_logprobs(self) -> int | None:
        """Top logprobs to return per token under this endpoint's fields (None: off)."""

    def refuse_unsupported(self) -> None:
        """400 naming the first field mmserve would otherwise drop (``UNSUPPORTED``), or
        a field that means nothing without another (``refuse_orphans``)."""
        for name, value in (self.model_extra or {}).items():
            if name not in UNSUPPORTED or _neutral(name, value):
                continue
            raise ParamError(UNSUPPORTED[name], param=name)
        self.refuse_orphans()

    def refuse_orphans(self) -> None:
        """400 for a field the request's other fields would make a no-op (as OpenAI and
        vLLM answer them), rather than drop it silently."""
        if self.stream_options is not None and not self.stream:
            raise ParamError(
                "stream_options is only allowed when stream is true", param="stream_options"
            )

    def structured(self) -> StructuredOutput | None:
        """The output constraint from ``response_format`` or ``structured_outputs``."""
        rf, so = self.response_format, self.structured_outputs
        if rf is not None and rf.type != "text" and so is not None:
            raise ParamError(
                "give response_format or structured_outputs, not both", param="structured_outputs"
            )
        if rf is not None and rf.type == "json_object":
            return StructuredOutput("json_object")
        if rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise ParamError(
                    "response_format json_schema needs json_schema.schema",
                    param="response_format.json_schema",
                )
            return StructuredOutput.json_schema(rf.json_schema.schema_)
        return _structured_outputs(so) if so is not None else None

    def bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        try:
            return {int(k): v for k, v in self.logit_bias.items()}
        except ValueError as err:
            raise ParamError("logit_bias keys must be token ids", param="logit_bias") from err

    def to_sampling_params(
        self, max_tokens: int | None, structured: StructuredOutput | None = None
    ) -> SamplingParams:
        """``structured``: the constraint the route settled on (default: ``structured()``)."""
        self.refuse_unsupported()
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            seed=self.seed,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            logprobs=self.num_logprobs(),
            structured=structured if structured is not None else self.structured(),
            logit_bias=self.bias(),
        )


def _neutral(name: str, value: Any) -> bool:
    """A value that asks for nothing: null, the default (``_DEFAULTS``), else false or
    empty."""
    if value is None:
        return True
    if name in _DEFAULTS:
        want = _DEFAULTS[name]
        return type(value) is type(want) and value == want
    return value is False or value == [] or value == {}


def _structured_outputs(so: StructuredOutputs) -> StructuredOutput:
    given = {k: v for k, v in so.model_dump(by_alias=True).items() if v not in (None, False)}
    if len(given) != 1:
        raise ParamError(
            "structured_outputs takes exactly one of json, regex, choice, grammar, "
            f"json_object, structural_tag; got {sorted(given) or 'none'}",
            param="structured_outputs",
        )
    ((kind, value),) = given.items()
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "choice":
        return StructuredOutput.choices(value)
    if kind in ("json", "structural_tag") and not isinstance(value, str):
        value = json.dumps(value)
    try:
        return StructuredOutput(kind, value)
    except ValueError as err:
        raise ParamError(str(err), param=f"structured_outputs.{kind}") from err


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not v:
            raise ValueError("messages must hold at least one message")
        return v

    def requested_max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0

    def refuse_orphans(self) -> None:
        super().refuse_orphans()
        if self.top_logprobs is not None and not self.logprobs:
            raise ParamError("top_logprobs needs logprobs set to true", param="top_logprobs")


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be an empty list")
        return v

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def refuse_orphans(self) -> None:
        super().refuse_orphans()
        if self.echo and self.logprobs is not None:
            # OpenAI's echoed logprobs start with the prompt's tokens
            raise ParamError(
                "echo with logprobs is not supported: it returns the prompt's logprobs, "
                "and the prefill keeps only its last row's logits",
                param="echo",
            )
