"""The streamed generation from an engine server survives a kept-alive connection the server had just closed."""

from __future__ import annotations

import httpx
import pytest

from serving.engine import Delta, GenerationHandle
from serving.engines.sse import stream_generation


def parse(event: dict):
    return Delta(event["content"], [1], [0.0], [], [event["content"]]), event.get("stop_type")


def client_failing(times: int) -> tuple[httpx.Client, list[int]]:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) <= times:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        body = 'data: {"content": "hel"}\n\ndata: {"content": "lo", "stop_type": "eos"}\n\n'
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    return httpx.Client(base_url="http://engine", transport=httpx.MockTransport(handler)), calls


def generate(client: httpx.Client):
    return stream_generation(client, "/completion", {"prompt": [1]}, GenerationHandle(), None, parse,
                             keep_tops=False, on_progress=lambda: None)


def test_a_request_lost_on_a_closed_keepalive_connection_is_sent_once_more():
    client, calls = client_failing(1)
    done = generate(client)
    assert (done.text, done.finish_reason, len(calls)) == ("hello", "eos", 2)


def test_an_engine_that_keeps_dropping_the_request_fails_it_after_one_retry():
    client, calls = client_failing(5)
    with pytest.raises(httpx.RemoteProtocolError):
        generate(client)
    assert len(calls) == 2
