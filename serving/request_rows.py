"""The request log's rows as the server builds them: an answered request's row, a shadow's, and the feedback body
(`POST /v1/feedback`). The writer that takes them off the request path is `serving.request_log`."""

from __future__ import annotations

from pydantic import Field

from mlops.requestlog import Feedback, LoggedRequest
from serving.api_schema import _Strict, parse_body


class FeedbackRequest(_Strict):
    request_id: str = Field(min_length=1, max_length=80, description="the X-Request-ID of the answer rated")
    rating: int = Field(ge=-1, le=1, description="-1 bad, 0 neutral, 1 good")
    correction: str | None = Field(None, max_length=20000, description="what the answer should have said")


def parse_feedback(raw: bytes | None, source: str | None) -> Feedback:
    """The feedback in a request body; an ApiError (400) naming the field when it is malformed."""
    body = parse_body(raw or b"", FeedbackRequest)
    correction = body.correction if body.correction and body.correction.strip() else None
    return Feedback(body.request_id, body.rating, correction=correction, source=source)


def request_messages(prep, engine):
    """A prepared request's prompt as chat messages, as the log stores it (the client's messages, without the
    profile's system prompt). Token-id prompts are decoded later, on the writer's thread."""
    body = prep.body
    if prep.chat:
        return [{"role": m.role, "content": m.text()} for m in body.messages]
    if isinstance(body.prompt, str):
        return [{"role": "user", "content": body.prompt}]
    if body.prompt and isinstance(body.prompt[0], str):
        return [{"role": "user", "content": p} for p in body.prompt]
    ids = [list(p) for p in prep.prompts]
    return lambda: [{"role": "user", "content": engine.detokenize(p)} for p in ids]


def answered_row(model: str, record: dict, serving, capture: dict) -> LoggedRequest:
    """The log row of one answered request, from the middleware's access record and what its handler captured
    (`capture["key"]`: the sending API key's name)."""
    response = capture.get("response")
    if response is None:
        response = "".join(capture.get("parts") or ())  # streamed, possibly cut short by a disconnect
    return LoggedRequest(
        record["request_id"], model[:256], log_version(serving.version), record["route"], capture.get("messages") or [],
        response,
        status=record["status"], role=record.get("role") or "user", profile_hash=serving.profile_hash,
        latency_ms=record["latency_ms"] or 0.0, ttft_ms=record.get("ttft_ms"),
        tokens_in=record.get("prompt_tokens") or 0, tokens_out=record.get("completion_tokens") or 0,
        error=capture.get("error"), key=capture.get("key"), engine=serving_engine(serving),
        quantization=getattr(getattr(serving, "profile", None), "quantization", None),
    )


def serving_engine(serving) -> str | None:
    return getattr(getattr(serving, "engine", None), "name", None)


def log_version(version: str) -> str:
    """A version as the trace's tag holds it: registry versions are short; a folder's name may not be."""
    if len(version) <= 40:
        return version
    import hashlib

    return version[:31] + "~" + hashlib.sha1(version.encode()).hexdigest()[:8]
