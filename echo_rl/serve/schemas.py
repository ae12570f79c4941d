"""Request bodies of the OpenAI-compatible endpoints, validated strictly.

Strict types: ``"max_tokens": "10"`` is a 400, not a silent cast. Unknown
fields are accepted and ignored, as vLLM does, so newer clients keep working.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Base(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class TextPart(_Base):
    type: Literal["text"]
    text: str


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart]]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


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


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str]]
    max_tokens: int | None = Field(None, ge=0)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
