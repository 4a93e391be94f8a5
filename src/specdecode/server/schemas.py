"""Pydantic models of every request and response body (OpenAI's shapes, plus documented extensions).

Requests are strict (no type coercion) and forbid unknown fields. Extensions beyond
OpenAI's API: `draft` ("ngram", "none", or the server's configured draft), `gamma`,
`min_confidence` and `top_k` in requests; `usage.speculative` in responses.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

__all__ = [
    "GenerationFields",
    "CompletionRequest",
    "ChatCompletionRequest",
    "ChatMessage",
    "TextPart",
    "StreamOptions",
    "CompletionResponse",
    "CompletionChoice",
    "CompletionChunk",
    "ChatCompletionResponse",
    "ChatChoice",
    "ChatCompletionChunk",
    "ChatChunkChoice",
    "ChatDelta",
    "AssistantMessage",
    "Usage",
    "SpeculativeUsage",
    "ModelCard",
    "ModelList",
    "Health",
    "ErrorBody",
    "ErrorDetail",
    "request_field_names",
]

MAX_STOP = 4  # as OpenAI
MAX_GAMMA = 32


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class GenerationFields(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions (null means the default)."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    # extensions
    draft: str | None = Field(None, description="'ngram', 'none' or the server's configured draft (its name or 'default')")
    gamma: int | None = Field(None, ge=1, le=MAX_GAMMA, description="draft tokens per target call")
    min_confidence: float | None = Field(
        None, ge=0.0, le=1.0,
        description="a draft model ends its draft after a token its q gave less than this (0: always gamma tokens); "
        "null: the server's setting",
    )
    top_k: int | None = Field(None, ge=0, description="keep the k most likely tokens (0: all)")

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise PydanticCustomError("unsupported_value", "only n=1 is supported (one choice per request), got {n}", {"n": n})
        return n

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP:
            raise PydanticCustomError("too_long", "at most {max} stop sequences are allowed", {"max": MAX_STOP})
        if any(not s for s in stops):
            raise PydanticCustomError("string_too_short", "stop sequences must be non-empty strings")
        return stop

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(GenerationFields):
    """POST /v1/completions. `prompt` is text, a list with one text, or a list of token ids."""

    prompt: str | list[str] | list[int]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(GenerationFields):
    """POST /v1/chat/completions; `max_completion_tokens` is the newer name of `max_tokens`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


# --------------------------------------------------------------------------- responses


class SpeculativeUsage(BaseModel):
    """Extension: how speculative decoding went for this request."""

    draft: str
    gamma: int
    min_confidence: float | None = Field(description="the draft model's early-end threshold; null for drafts without a model")
    target_calls: int
    draft_tokens: int
    accepted_tokens: int
    mean_accepted: float = Field(description="tokens produced per target call")
    alpha: float | None = Field(description="accepted / evaluated draft tokens; null when no draft was evaluated")
    seconds: float
    tokens_per_s: float


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    speculative: SpeculativeUsage | None = None


FinishReason = Literal["stop", "length"]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: FinishReason | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class CompletionChunk(CompletionResponse):
    """One server-sent event of a streamed completion (OpenAI uses the same object name)."""


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: FinishReason


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specdecode"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    model: str
    draft: str
    gamma: int
    min_confidence: float | None = Field(description="the draft model's early-end threshold; null for drafts without a model")
    waiting: int = Field(description="requests queued for the model")
    running: int = Field(description="requests being generated (up to max_batch)")
    max_batch: int = Field(description="requests decoded together (1: one at a time)")
    pass_seconds: dict[str, float] | None = Field(
        default=None, description="seconds of one batched forward pass by the rows it feeds, timed at start-up "
                                  "(what draft lengths are priced on); null where requests run one at a time")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


def request_field_names() -> set[str]:
    """Every field name of the request models (used to name the parameter in validation errors)."""
    names: set[str] = set()
    for model in (CompletionRequest, ChatCompletionRequest, ChatMessage, TextPart, StreamOptions):
        names.update(model.model_fields)
    return names
