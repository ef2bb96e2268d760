"""A generation streamed from an engine server over server-sent events (llama-server, vLLM), gathered into a
`Generated` while its `Delta`s go to the caller; closing the stream is how a cancelled generation stops there."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from serving.engine_types import Delta, Generated, GenerationHandle


def stream_generation(client, path: str, body: dict, handle: GenerationHandle, on_text: Callable | None,
                      parse: Callable[[dict], tuple[Delta | None, str | None]], *, keep_tops: bool,
                      on_progress: Callable[[], None]) -> Generated:
    """POST `body` to `path`; `parse(event)` gives each event's delta and, on the last, the finish reason.

    A kept-alive connection that the engine server closed just as the request went out ends with no response at
    all (httpx.RemoteProtocolError before any header): nothing was generated, so it is sent once more on a fresh
    connection instead of failing the user's request."""
    import httpx

    answered: list[bool] = []
    try:
        return _stream_once(client, path, body, handle, on_text, parse, keep_tops, on_progress, answered)
    except httpx.RemoteProtocolError:
        if answered:
            raise
        return _stream_once(client, path, body, handle, on_text, parse, keep_tops, on_progress, answered)


def _stream_once(client, path, body, handle, on_text, parse, keep_tops, on_progress, answered) -> Generated:
    text, tokens, lps, tops, finish = [], [], [], [], "length"
    with client.stream("POST", path, json=body) as response:
        answered.append(True)
        if response.status_code != 200:
            raise RuntimeError(f"{client.base_url} answered {response.status_code}: {response.read().decode()[:300]}")
        for line in response.iter_lines():
            if handle.dropped():  # leaving the block closes the connection: the server stops this generation
                finish = "cancelled"
                break
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta, done = parse(json.loads(line[len("data: "):]))
            on_progress()
            if delta is not None:
                if delta.tokens and handle.first_token_at is None:
                    handle.first_token_at = time.perf_counter()
                text.append(delta.text)
                tokens, lps, tops = tokens + delta.tokens, lps + delta.logprobs, tops + delta.top_logprobs
                if on_text is not None and (delta.text or delta.tokens):
                    on_text(delta)
            finish = done or finish
    return Generated("".join(text), tokens, lps, tops if keep_tops else [], finish)
