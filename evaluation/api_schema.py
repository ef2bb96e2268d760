"""Request bodies and errors of the OpenAI-compatible API (the subset lm-eval and the `openai` client use)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_LOGPROBS = 20


class ApiError(Exception):
    """An error answered as `{"error": {...}}` with an HTTP status; the server keeps serving."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self, request_id: str) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code},
            "request_id": request_id,
        }


class _Request(BaseModel):
    # Clients send more fields than we use (user, n, presence_penalty, stream_options...): ignore them.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, description="tokens to generate (profile default when absent)")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    n: int = Field(1, ge=1, le=1, description="one choice per prompt")

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > 4:
            raise ApiError(400, f"'stop' holds {len(stops)} strings; at most 4 are allowed.", param="stop")
        return [s for s in stops if s]


class CompletionRequest(_Request):
    prompt: str | list[int] | list[list[int]] | list[str]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"] = "text"
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(_Request):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: int | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt: str
    add_special_tokens: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[int]
