"""Server-sent events for `stream: true`: text deltas as the worker produces them, a final chunk with the
finish reason, a usage chunk with empty `choices` when `stream_options.include_usage` asks for it, `[DONE]`.
With `logprobs` each chunk carries the logprobs of the tokens its text completes. A client that goes away
cancels its generation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from serving.completions import Prepared, View, usage
from serving.logprobs import chat_logprobs, offsets, top_dicts

log = logging.getLogger("mlops.serve")


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def stream(view: View, prep: Prepared, request, rid: str):
    from fastapi.responses import StreamingResponse

    loop = asyncio.get_running_loop()
    deltas: asyncio.Queue = asyncio.Queue()

    def push(item) -> None:
        try:
            loop.call_soon_threadsafe(deltas.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    ids, params, chat = prep.prompts[0], prep.params[0], prep.chat
    wants_logprobs = bool(prep.body.logprobs) if chat else prep.body.logprobs is not None
    job = view.engine.generate(ids, params, on_text=push, owner=object())
    job.future.add_done_callback(lambda _f: push(None))
    record, started = request.state.access, request.state.started
    parts = request.state.capture.setdefault("parts", [])  # the answer as sent, for the request log
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}", "object": kind, "created": int(time.time()),
            "model": view.name}
    position = [0]  # text offset of the next completion chunk

    def chunk(delta, finish: str | None = None, first: bool = False) -> dict:
        text = delta.text if delta is not None else ""
        logprobs = None
        if wants_logprobs and delta is not None and delta.tokens:
            tops = delta.top_logprobs or [None] * len(delta.tokens)
            if chat:
                logprobs = {"content": chat_logprobs(view.engine, delta.tokens, delta.logprobs, tops,
                                                     delta.token_texts)}
            else:
                logprobs = {"tokens": delta.token_texts, "token_logprobs": delta.logprobs,
                            "top_logprobs": top_dicts(view.engine, tops),
                            "text_offset": offsets(delta.token_texts, position[0])}
        position[0] += len(text)
        if chat:
            body = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": body, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {**base, "choices": [choice], **({"usage": None} if prep.include_usage else {})}

    async def events():
        try:
            if chat:
                yield sse(chunk(None, first=True))
            while (delta := await deltas.get()) is not None:
                if record["ttft_ms"] is None:
                    record["ttft_ms"] = round((time.perf_counter() - started) * 1000, 1)
                parts.append(delta.text)
                yield sse(chunk(delta))
            try:
                gen = job.future.result()
            except Exception as err:  # noqa: BLE001 - reported in-band: the status line is already sent
                log.error("request_id=%s generation failed mid-stream", rid, exc_info=err)
                record["failed"] = True  # a 200 already sent: counted as this version's error all the same
                request.state.capture["error"] = f"generation failed mid-stream: {type(err).__name__}"
                yield sse({"error": {"message": f"generation failed (request id {rid}); the cause is in the server "
                                     "log under that id.", "type": "server_error", "code": "internal_error"},
                           "request_id": rid})
                yield sse("[DONE]")
                return
            record["completion_tokens"] = len(gen.tokens)
            yield sse(chunk(None, gen.finish_reason))
            if prep.include_usage:
                yield sse({**base, "choices": [], "usage": usage(len(ids), len(gen.tokens))})
            yield sse("[DONE]")
        finally:
            job.cancelled.set()  # a client that went away stops the generation
            job.future.cancel()

    record["prompt_tokens"] = len(ids)
    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
