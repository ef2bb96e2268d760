"""A spot-check's answers in deployment form: each model served by the real OpenAI-compatible server app under
the deployment profile stored with its version (system prompt, template, sampling, stops, engine), in-process,
and asked through its HTTP API exactly like a client would. The registry asks for these through the core's
`spot_check_answers` service and stores them with the check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

Answerer = Callable[[str, list[list[dict]]], list[dict]]


def deployment_profile(desc, hf_dir: Path):
    """The profile stored with the version (what serving uses), else the one in its folder."""
    from mlops.profile import load_profile

    return desc.stored_profile() or load_profile(hf_dir)


def served_answers(ref: str, conversations: list[list[dict]], *, max_tokens: int | None = None,
                   concurrency: int = 8) -> list[dict]:
    """Each conversation's answer from `ref` served under its profile: {"text", "latency_ms", "tokens", "error"}."""
    import asyncio

    from mlops.model_refs import describe, materialize
    from serving.server import create_app

    desc = describe(ref)
    model = materialize(desc)
    app = create_app(model.hf_dir, deployment_profile(desc, model.hf_dir), model_name=desc.served_name,
                     version=desc.version)
    try:
        return asyncio.run(_ask_all(app, conversations, max_tokens, concurrency))
    finally:
        app.state.slot.close()


async def _ask_all(app, conversations: list[list[dict]], max_tokens: int | None, concurrency: int) -> list[dict]:
    import asyncio
    import time

    import httpx

    gate = asyncio.Semaphore(concurrency)  # the engine batches these; more would only queue

    async def ask(client, messages: list[dict]) -> dict:
        body = {"messages": messages, **({"max_tokens": max_tokens} if max_tokens else {})}
        async with gate:
            started = time.perf_counter()
            resp = await client.post("/v1/chat/completions", json=body)
        latency = round((time.perf_counter() - started) * 1000, 1)
        data = resp.json()
        if resp.status_code != 200:
            error = (data.get("error") or {}).get("message") or f"HTTP {resp.status_code}"
            return {"text": "", "latency_ms": latency, "tokens": 0, "error": error}
        return {"text": data["choices"][0]["message"]["content"], "latency_ms": latency,
                "tokens": (data.get("usage") or {}).get("completion_tokens", 0), "error": None}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://spot-check", timeout=600) as client:
        return list(await asyncio.gather(*(ask(client, m) for m in conversations)))
