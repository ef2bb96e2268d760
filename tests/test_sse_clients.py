"""Our streaming clients (the load generator, the soak) read server-sent events with httpx-sse: data lines split
across fields, comments and keep-alives, a JSON error inside the stream, and [DONE]."""

from __future__ import annotations

import asyncio
import json

import httpx

CHUNK = {"choices": [{"delta": {"content": "hi"}}]}
USAGE = {"choices": [], "usage": {"completion_tokens": 3}}


def client_for(body: str, status: int = 200) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept"] == "text/event-stream"
        return httpx.Response(status, content=body.encode(), headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://test")


def events(*items: str) -> str:
    return "".join(f"{item}\n\n" for item in items)


def test_the_load_generator_counts_first_token_tokens_and_done_from_parsed_events():
    from serving.loadgen import stream_once

    body = events(": keep-alive", f"data: {json.dumps(CHUNK)}", "event: message\ndata: " + json.dumps(CHUNK),
                  f"data: {json.dumps(USAGE)}", "data: [DONE]")
    out = asyncio.run(stream_once(client_for(body), {"stream": True}))
    assert out["status"] == 200 and out["done"] and out["tokens"] == 3 and out["ttft"] is not None


def test_the_load_generator_reports_an_error_inside_the_stream_and_a_refused_request():
    from serving.loadgen import stream_once

    broken = asyncio.run(stream_once(client_for(events('data: {"error": {"message": "engine died"}}')), {}))
    assert broken["status"] == "error-in-stream" and not broken["done"]
    refused = asyncio.run(stream_once(client_for('{"error": "busy"}', status=429), {}))
    assert refused["status"] == 429 and refused["ttft"] is None


def test_the_soak_stream_needs_done_and_its_disconnect_leaves_after_the_first_chunk():
    from serving.soak import _one

    whole = events(f"data: {json.dumps(CHUNK)}", "data: [DONE]")
    assert asyncio.run(_one(client_for(whole), "stream", 1, [], 8))[3] is True
    cut = events(f"data: {json.dumps(CHUNK)}")
    assert asyncio.run(_one(client_for(cut), "stream", 1, [], 8))[3] is False
    assert asyncio.run(_one(client_for(cut), "disconnect", 1, [], 8))[3] is True
