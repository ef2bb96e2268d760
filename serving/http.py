"""What every request goes through before and after its handler (one pure ASGI middleware, in this order):

request id -> auth (password sign-in on a worker thread, under backoff) -> body-size limit -> model lease (the canary's for its share of generation requests, else
the main slot's) -> handler, then access log + metrics, then the request log row and the shadow offer (both
queued for background threads, never awaited). It is a plain
ASGI wrapper, not `BaseHTTPMiddleware`, so streaming responses, client disconnects and cancellation pass
through untouched, and it sits inside Starlette's error middleware: an exception a handler lets escape is
logged here once (one traceback, with the request id) and answered as a 500 that carries `X-Request-ID`
and no internal detail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid

from serving.api_schema import ApiError
from serving.metrics import GENERATION_ROUTES, log_access, now_ms, route_label

log = logging.getLogger("mlops.serve")
REQUEST_ID = "X-Request-ID"
MODEL_VERSION = "X-Model-Version"
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
ALWAYS_OPEN = ("/health", "/ready")
_GONE = object()
MODEL_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize",
                "/tokenizer_info")


class ServingMiddleware:
    def __init__(self, app, ctx) -> None:
        self.app = app
        self.ctx = ctx  # server.ServerContext

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx, started = self.ctx, time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get(REQUEST_ID.lower(), "")
        rid = given if _SAFE_ID.match(given) else uuid.uuid4().hex
        path = scope.get("path", "")
        record = {"request_id": rid, "method": scope.get("method"), "route": route_label(path), "status": None,
                  "prompt_tokens": None, "completion_tokens": None, "ttft_ms": None, "latency_ms": None,
                  "model_version": None, "role": "user", "key_id": None,
                  "client": (scope.get("client") or ("-",))[0]}
        state = scope.setdefault("state", {})
        capture: dict = {}  # what a generation handler saw and answered, for the request log and the shadow
        state["request_id"], state["access"], state["started"], state["capture"] = rid, record, started, capture
        serving, leased_from, started_response, body, logged = None, None, False, None, False

        def log_answer() -> None:
            """Once per answered generation request: as its last byte leaves, or at the end when it was cut short."""
            nonlocal logged
            if not logged and serving is not None and path in GENERATION_ROUTES:
                logged = True
                record["latency_ms"] = now_ms(started)
                self._after_answer(record, serving, capture, body)

        async def send_with_ids(message) -> None:
            nonlocal started_response
            if message["type"] == "http.response.start":
                started_response = True
                record["status"] = message["status"]
                extra = [(REQUEST_ID.lower().encode(), rid.encode())]
                if serving is not None:
                    extra.append((MODEL_VERSION.lower().encode(), serving.version.encode("latin-1", "replace")))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                # Queued before the answer's last byte leaves: a client holding the answer may at once send
                # anything keyed on its request id (feedback) and must find it queued or written.
                log_answer()
            await send(message)

        ctx.metrics.inflight.inc()
        try:
            if ctx.keys is not None and not self._open(path):
                verdict = await ctx.keys.check(headers.get("authorization"), record["client"])
                identity = verdict.identity
                if identity is None:
                    await reply(send_with_ids, rid, *_refusal(verdict))
                    return
                record["key_id"] = identity.key_id
                state["identity"] = identity
            body = await self._read_body(scope, receive, headers)
            if body is _GONE:
                record["status"] = 499  # the client left while sending its body
                return
            if isinstance(body, ApiError):
                await reply(send_with_ids, rid, body)
                return
            if path.startswith(MODEL_ROUTES):
                from serving.slot import SlotError

                if ctx.canary is not None and path in GENERATION_ROUTES:
                    serving = ctx.canary.acquire()  # a server-side draw, never the client's id
                    if serving is not None:
                        leased_from, record["role"] = ctx.canary.slot, "canary"
                if serving is None:
                    try:
                        serving, leased_from = ctx.slot.acquire(), ctx.slot
                    except SlotError as err:
                        await reply(send_with_ids, rid, ApiError(503, str(err), code="model_not_loaded"))
                        return
                state["serving"] = serving
                record["model_version"] = serving.version
            await self.app(scope, _replay(body, receive), send_with_ids)
        except asyncio.CancelledError:
            record["status"] = record["status"] or 499
            if not ctx.draining:
                raise
            # Cut by the drain timeout: counted (the exit code says so) and ended here, instead of a traceback
            # from the server for every request that was still running.
            ctx.cut += 1
        except Exception as err:  # noqa: BLE001 - the one place an escaped error is logged and answered
            log.error("request_id=%s %s %s failed with an internal error", rid, scope.get("method"), path,
                      exc_info=err)
            if not started_response:
                await reply(send_with_ids, rid, ApiError(
                    500, f"internal error while serving this request (request id {rid}); the cause is in the "
                    "server log under that id.", code="internal_error"))
        finally:
            if serving is not None:
                leased_from.release(serving)
            ctx.metrics.inflight.dec()
            record["latency_ms"] = now_ms(started)
            record["status"] = record["status"] or 499
            ctx.metrics.observe(record)
            if ctx.config.access_log:
                log_access(record)
            log_answer()

    def _after_answer(self, record: dict, serving, capture: dict, body) -> None:
        """Queue the request log row and offer the request to the shadow; both return at once."""
        ctx = self.ctx
        if capture.get("scoring"):  # loglikelihood requests (lm-eval) are measurements, not conversations
            return
        try:
            if ctx.request_log is not None:
                from serving.request_rows import answered_row

                ctx.request_log.submit(answered_row(ctx.log_model or ctx.slot.name, record, serving, capture))
            if (ctx.shadow is not None and record["status"] == 200 and record["role"] == "user" and not record.get("failed")
                    and capture.get("shadowable") and isinstance(body, bytes)):
                ctx.shadow.offer(record["request_id"], record["route"], body)
        except Exception as err:  # noqa: BLE001 - the answer is sent; logging it must never fail it
            log.error("request_id=%s could not be logged or shadowed: %s: %s", record["request_id"],
                      type(err).__name__, err)

    def _open(self, path: str) -> bool:
        return path in ALWAYS_OPEN or (path == "/metrics" and self.ctx.config.auth.open_metrics)

    async def _read_body(self, scope, receive, headers: dict) -> bytes | ApiError | object | None:
        """The whole body, or a 413 as soon as it is known to exceed the limit (without reading the rest)."""
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return None
        limit = self.ctx.config.max_body_bytes
        too_big = ApiError(413, f"the request body is larger than this server's limit of {limit} bytes "
                           "(serve.max_body_bytes); send fewer or shorter prompts per request.",
                           code="request_too_large")
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return too_big
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _GONE
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return too_big
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes | None, receive):
    """`receive` that hands the already-read body to the app once, then waits for the disconnect."""
    if body is None:
        return receive
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _refusal(verdict) -> tuple[ApiError, dict]:
    """The answer to a request whose credentials did not pass (`serving.auth.Verdict`)."""
    if verdict.status == 429:
        return (ApiError(429, f"{verdict.why}.", code="too_many_sign_in_attempts"),
                {"retry-after": str(int(verdict.retry_after))})
    if verdict.status == 503:
        return (ApiError(503, f"{verdict.why}.", code="identity_store_unavailable"),
                {"retry-after": str(int(verdict.retry_after))})
    return ApiError(401, f"{verdict.why}.", code="invalid_api_key"), {"www-authenticate": "Bearer"}


async def reply(send, rid: str, err: ApiError, headers: dict | None = None) -> None:
    payload = json.dumps(err.body(rid)).encode()
    extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": payload})


async def disconnected(receive) -> None:
    """Returns when the client goes away (the body was read already, so the next message is the disconnect)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_done(request, futures: list, cancel) -> list | None:
    """Results of engine futures, or None when the client disconnected first (the work is cancelled)."""
    gathered = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    gone = asyncio.ensure_future(disconnected(request.receive))
    try:
        done, _ = await asyncio.wait({gathered, gone}, return_when=asyncio.FIRST_COMPLETED)
        if gathered in done:
            return gathered.result()
        return None
    finally:
        gone.cancel()
        if not gathered.done():
            gathered.cancel()
            cancel()
