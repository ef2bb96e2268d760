"""Request bodies and errors of the OpenAI-compatible API (the subset lm-eval and the `openai` client use).

Bodies are parsed strictly: `true` or `"5"` is not an integer, integers must fit in 64 bits, floats must be
finite, strings must be valid Unicode (no lone surrogates). Fields the server does not implement are refused
with a 400 that says so, unless they carry their neutral value (`n: 1`, `presence_penalty: 0`, ...), so a
client never gets a silently different answer than it asked for.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_LOGPROBS = 20
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


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
        if self.status in (401, 403):
            kind = "authentication_error"
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code},
            "request_id": request_id,
        }


class _Strict(BaseModel):
    # Clients send more fields than we use (user, metadata, store...): unknown names are ignored, but the
    # ones we know and do not implement are checked by `unsupported()`.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


# field -> neutral values that change nothing; anything else is refused as "not supported".
_UNSUPPORTED: dict[str, tuple] = {
    "n": (None, 1), "best_of": (None, 1), "suffix": (None, ""), "logit_bias": (None, {}),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "repetition_penalty": (None, 1),
    "response_format": (None, {"type": "text"}), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"), "audio": (None,), "prediction": (None,),
    "modalities": (None, ["text"]),
}


class _Request(_Strict):
    model: str | None = None
    max_tokens: Int64 | None = Field(None, description="tokens to generate (profile default when absent)")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > 4:
            raise ApiError(400, f"'stop' holds {len(stops)} strings; at most 4 are allowed.", param="stop")
        return [s for s in stops if s]

    def include_usage(self) -> bool:
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "'stream_options' is only allowed with 'stream': true.", param="stream_options")
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Request):
    prompt: str | list[TokenId] | list[list[TokenId]] | list[str]
    echo: bool = False
    logprobs: Int64 | None = Field(None, ge=0, le=MAX_LOGPROBS)


class ContentPart(_Strict):
    type: str = "text"
    text: str | None = None


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class ChatRequest(_Request):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: Int64 | None = Field(None, ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: Int64 | None = None


class TokenizeRequest(_Strict):
    prompt: str
    add_special_tokens: bool = False


class DetokenizeRequest(_Strict):
    tokens: list[TokenId]


# --------------------------------------------------------------------------- parsing


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """Parse and validate one request body; every problem is an ApiError naming the field."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply.", code="invalid_json") from None
    except UnicodeDecodeError as err:
        raise ApiError(400, f"the request body is not valid UTF-8 ({err.reason} at byte {err.start}).",
                       code="invalid_json") from None
    except ValueError as err:  # JSONDecodeError, and integers longer than Python's digit limit
        raise ApiError(400, f"the request body is not valid JSON: {err}.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}.", code="invalid_json")
    check_unicode(data)
    unsupported(data, model)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _as_api_error(err) from None


def check_unicode(value: Any, path: str = "") -> None:
    """Refuse strings that are not valid Unicode (lone surrogates from `\\ud800` escapes) anywhere in a body."""
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ApiError(
                    400, f"'{where or 'body'}' is not valid Unicode: it holds a lone surrogate "
                    f"(U+{ord(item[err.start]):04X} at character {err.start}). Send valid UTF-8 text.",
                    param=where or None,
                ) from None
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((f"{where}.{key}" if where else str(key), key))
                stack.append((f"{where}.{key}" if where else str(key), child))
        elif isinstance(item, list):
            stack.extend((f"{where}.{i}" if where else str(i), child) for i, child in enumerate(item))


def unsupported(data: dict, model: type[BaseModel]) -> None:
    if model not in (CompletionRequest, ChatRequest):
        return
    for name, neutral in _UNSUPPORTED.items():
        if name in data and not any(_same(data[name], n) for n in neutral):
            shown = json.dumps(data[name])[:80]
            raise ApiError(
                400, f"'{name}' is not supported by this server (got {shown}); leave it out"
                + (f" or send {json.dumps(neutral[1])}." if len(neutral) > 1 else "."),
                param=name, code="unsupported_parameter",
            )
    if model is ChatRequest:
        for i, message in enumerate(data.get("messages") or []):
            parts = message.get("content") if isinstance(message, dict) else None
            for j, part in enumerate(parts if isinstance(parts, list) else []):
                kind = part.get("type", "text") if isinstance(part, dict) else None
                if kind != "text":
                    raise ApiError(400, f"content parts of type {json.dumps(kind)} are not supported; send text.",
                                   param=f"messages.{i}.content.{j}.type", code="unsupported_parameter")


def _same(value: Any, neutral: Any) -> bool:
    # `True == 1` in Python: a boolean is never the neutral integer.
    return type(value) is type(neutral) and value == neutral or (
        type(neutral) is int and type(value) is float and value == neutral
    )


def _as_api_error(err: ValidationError) -> ApiError:
    problems = err.errors(include_url=False)
    first = problems[0]
    # Union members add their type name to the location ("prompt.str"): keep the body's field path only.
    loc = [str(p) for p in first["loc"] if not (isinstance(p, str) and _is_type_name(p))]
    param = ".".join(loc) or None
    shown = json.dumps(first.get("input"), default=str)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    message = f"'{param or 'body'}': {first['msg'].rstrip('.')} (got {shown})."
    if first["type"] == "missing":
        message = f"'{param}' is required."
    if len(problems) > 1 and not _all_one_field(problems, first):
        message += f" ({len(problems) - 1} more problem{'s' if len(problems) > 2 else ''} in the body.)"
    return ApiError(400, message, param=param)


def _is_type_name(part: str) -> bool:
    return part in {"str", "int", "float", "bool", "list", "dict"} or part.startswith(("list[", "function-"))


def _all_one_field(problems: list[dict], first: dict) -> bool:
    return all(p["loc"][:1] == first["loc"][:1] for p in problems)
