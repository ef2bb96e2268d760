"""A bounded load generator for our own servers (streaming chat over httpx): one level of concurrency at a time.

Used by `mlops release capacity` and the serving benchmarks. Traffic goes only to the URL it is given, which the
callers start on 127.0.0.1; every level sends a fixed number of requests.
"""

from __future__ import annotations

import asyncio
import json
import time

CHAT = "/v1/chat/completions"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else float("nan")


def chat_body(i: int, max_tokens: int, model: str = "bench") -> dict:
    return {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Question {i}: where is my order and when will it arrive?"}]}


async def stream_once(client, body: dict, disconnect_after: int | None = None) -> dict:
    """One streamed chat: status, time to first token, completion tokens, whether [DONE] came, latency."""
    started = time.perf_counter()
    out = {"status": None, "ttft": None, "tokens": 0, "done": False, "latency": None}
    chunks = 0
    from httpx_sse import aconnect_sse

    async with aconnect_sse(client, "POST", CHAT, json=body) as source:
        response = source.response
        out["status"] = response.status_code
        if response.status_code != 200:
            await response.aread()
            return out
        async for event in source.aiter_sse():  # httpx-sse parses the events (fields, multi-line data, comments)
            data = event.data
            if not data:
                continue
            if data == "[DONE]":
                out["done"] = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                out["status"] = "error-in-stream"
                break
            if not chunk["choices"] and chunk.get("usage"):
                out["tokens"] = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                chunks += 1
                if out["ttft"] is None:
                    out["ttft"] = time.perf_counter() - started
                if disconnect_after and chunks >= disconnect_after:
                    out["status"] = "disconnected"
                    break  # leaving the block closes the connection mid-stream
    out["latency"] = time.perf_counter() - started
    return out


def summarize(concurrency: int, wall: float, results: list[dict]) -> dict:
    good = [r for r in results if r["status"] == 200 and r["done"]]
    latencies, ttfts = [r["latency"] for r in good], [r["ttft"] for r in good if r["ttft"]]
    return {
        "concurrency": concurrency, "requests": len(results), "wall_s": wall,
        "tokens_per_s": sum(r["tokens"] for r in good) / wall if wall else 0.0,
        **{f"p{q}_ms": 1000 * percentile(latencies, q) for q in (50, 95, 99)},
        **{f"ttft_p{q}_ms": 1000 * percentile(ttfts, q) for q in (50, 95, 99)},
        "failures": len(results) - len(good),
    }


async def level(client, concurrency: int, requests: int, max_tokens: int, model: str = "bench") -> dict:
    """`requests` streamed chats to `model`, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> dict:
        async with gate:
            return await stream_once(client, chat_body(i, max_tokens, model))

    started = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(requests)))
    return summarize(concurrency, time.perf_counter() - started, list(results))
