"""Request bodies of the OpenAI-compatible endpoints, validated strictly.

Strict types: ``"max_tokens": "10"`` is a 400, not a silent cast. Unknown
fields are accepted and ignored, as vLLM does, so newer clients keep working.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Base(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class TextPart(_Base):
    type: Literal["text"]
    text: str


class FunctionCall(_Base):
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=1_000_000)  # a JSON object, as text (OpenAI's wire shape)


class ToolCallEntry(_Base):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None  # None only where an assistant turn holds tool_calls
    tool_calls: Annotated[list[ToolCallEntry], Field(max_length=64)] | None = None  # assistant turns only
    tool_call_id: str | None = Field(None, min_length=1, max_length=256)  # tool turns only: the call answered

    @model_validator(mode="after")
    def _roles(self) -> "ChatMessage":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content may be null only in an assistant message with tool_calls")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls is allowed only in assistant messages, not {self.role}")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id (the call it answers)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionDef(_Base):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
    description: str | None = Field(None, max_length=100_000)
    parameters: dict | None = None  # a JSON Schema of type object
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object(cls, value: dict | None) -> dict | None:
        if value is not None and value.get("type", "object") != "object":
            raise ValueError(f"must be a JSON Schema of type object, got type {value.get('type')!r}")
        if value is not None and not isinstance(value.get("properties", {}), dict):
            raise ValueError("properties must be an object (one JSON Schema per argument)")
        return value


class ToolDef(_Base):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Base):
    name: str = Field(min_length=1, max_length=64)


class NamedToolChoice(_Base):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Base):
    include_usage: bool = False


class _Sampling(_Base):
    model: str = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=8)
    stop: Union[str, Annotated[list[str], Field(max_length=4)], None] = None  # OpenAI: up to 4 sequences
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # int64, as the OpenAI API documents it

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: Annotated[list[ToolDef], Field(max_length=128)] | None = None
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None  # accepted; a reply holds the calls the model wrote


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str]]
    max_tokens: int | None = Field(None, ge=0)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
