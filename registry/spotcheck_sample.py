"""What a spot-check asks and how the answers are produced.

Prompts come from the business suite's items (stratified by dimension, so every area of the business is
looked at) and, once serving has logged them, from real served requests (already PII-scrubbed by the log).
Answers are produced in deployment form: each model is served by the real OpenAI-compatible server app under
the deployment profile stored with its version (system prompt, template, sampling, stops), in-process, and
asked through its HTTP API exactly like a client would.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from mlops.errors import ConfigError


@dataclass(frozen=True)
class Prompt:
    source: str  # "suite:<file>#<item id>" or "request:<request id>"
    stratum: str  # the suite's dimension, or "served"
    messages: list[dict]
    reference: str | None = None  # the suite's expected answer, shown to the reviewer as a hint

    def as_dict(self) -> dict:
        return asdict(self)


def suite_folder(path: str) -> Path:
    from mlops.paths import project_home

    folder = Path(path).expanduser()
    folder = folder if folder.is_absolute() else project_home() / folder
    if not folder.is_dir():
        repo = Path(__file__).resolve().parent.parent / path  # the suite shipped with the code
        if repo.is_dir():
            return repo
        raise ConfigError(f"registry.spot_check.suite '{path}' is not a folder (looked at {folder}). Fix: point it "
                          "at a folder of business eval items (JSONL), e.g. evaluation/suites/business.")
    return folder


def suite_prompts(folder: Path) -> list[Prompt]:
    """Every item of the suite as a free question; a multiple-choice item's reference is its right choice."""
    out: list[Prompt] = []
    seen: set[str] = set()
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            prompt = str(item.get("prompt") or "").strip()
            if not prompt or prompt.lower() in seen:
                continue
            seen.add(prompt.lower())
            reference = item.get("target")
            if reference is None and isinstance(item.get("choices"), list) and isinstance(item.get("answer"), int):
                reference = item["choices"][item["answer"]]
            out.append(Prompt(f"suite:{path.name}#{item.get('id', len(out))}",
                              str(item.get("dimension") or path.stem), [{"role": "user", "content": prompt}],
                              None if reference is None else str(reference)))
    return out


def served_prompts(model: str, *, days: float = 30, url: str | None = None) -> list[Prompt]:
    """Answered user requests of `model` in the last `days` from the request log, one per distinct conversation."""
    import time

    from mlops.requestlog import read_requests

    out, seen = [], set()
    for row in read_requests(model=model, role="user", since=time.time() - days * 86400, url=url):
        messages = [{"role": m.get("role"), "content": m.get("content", "")} for m in row["messages"]
                    if m.get("role") in ("system", "user", "assistant")]
        if row.get("status") != 200 or not messages or messages[-1]["role"] != "user":
            continue
        key = json.dumps(messages, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        out.append(Prompt(f"request:{row['request_id']}", "served", messages))
    return out


def allocate(n: int, sizes: dict[str, int]) -> dict[str, int]:
    """n items over strata as evenly as their sizes allow (a small stratum gives its share to the others)."""
    take = dict.fromkeys(sizes, 0)
    left = min(n, sum(sizes.values()))
    while left > 0:
        open_ = [s for s in sorted(sizes) if take[s] < sizes[s]]
        share, extra = divmod(left, len(open_))
        for i, s in enumerate(open_):
            add = min(sizes[s] - take[s], share + (1 if i < extra else 0))
            take[s] += add
            left -= add
    return take


def draw(suite: list[Prompt], served: list[Prompt], n: int, served_share: float, seed: int) -> list[Prompt]:
    """A seeded sample: `served_share` of n from served requests (as many as exist), the rest stratified."""
    rng = random.Random(seed)
    from_served = min(len(served), round(n * served_share))
    by_stratum: dict[str, list[Prompt]] = {}
    for p in suite:
        by_stratum.setdefault(p.stratum, []).append(p)
    plan = allocate(n - from_served, {s: len(ps) for s, ps in by_stratum.items()})
    chosen = rng.sample(served, from_served)
    for stratum in sorted(plan):
        chosen += rng.sample(by_stratum[stratum], plan[stratum])
    if len(chosen) < n:  # a small suite: fill from the requests not yet taken
        rest = [p for p in served if p not in chosen]
        chosen += rng.sample(rest, min(len(rest), n - len(chosen)))
    rng.shuffle(chosen)
    return chosen


def sample_digest(prompts: list[Prompt]) -> str:
    blob = json.dumps([p.as_dict() for p in prompts], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


# --------------------------------------------------------------------------- answers in deployment form

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
