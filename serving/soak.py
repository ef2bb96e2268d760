"""A soak run against a live server: sustained mixed load, measured in windows, to show drift.

The mix, cycled by each client: a chat answer, a streamed answer, a poison body (must be refused with a 4xx,
never a 5xx), a stream the client leaves after its first chunk, and feedback on an earlier answer (plus, now
and then, feedback on an id that was never served, which must be a 404). Each window records the server's RSS,
latency percentiles of the answers, the 5xx rate and the "unexpected" outcomes (an innocent request that
failed, poison that got a 5xx, feedback refused). `drift` compares the last third of the windows with the
first third (the first window, the warm-up, excluded): the RSS growth, the p50 latency ratio and both error
rates. Used by the soak test (about a minute) and `benchmarks/bench_soak.py` (as long as you like).
Traffic goes only to the URL given, which should be a loopback server the caller started.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

CHAT = "/v1/chat/completions"
POISON = (
    '{"messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}',
    '{"messages": [{"role": "user", "content": "bad \\ud800 text"}]}',
    '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": true}',
    '{"messages": "not a list"}',
)
MIX = ("chat", "stream", "chat", "feedback", "stream", "poison", "chat", "disconnect")


def rss_mb(pid: int) -> float:
    """Resident memory of a process from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _body(i: int, stream: bool, max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Order {i}: where is it and when does it arrive?"}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}


async def _one(client, kind: str, i: int, answered: list, max_tokens: int) -> tuple[str, int, float, bool]:
    """(kind, status, latency s, as expected)."""
    started = time.perf_counter()
    if kind == "chat":
        r = await client.post(CHAT, json=_body(i, False, max_tokens))
        if r.status_code == 200:
            answered.append(r.headers["x-request-id"])
        return kind, r.status_code, time.perf_counter() - started, r.status_code == 200
    if kind in ("stream", "disconnect"):
        from httpx_sse import aconnect_sse

        async with aconnect_sse(client, "POST", CHAT, json=_body(i, True, max_tokens)) as source:
            r, done = source.response, False
            if r.status_code != 200:
                await r.aread()
                return kind, r.status_code, time.perf_counter() - started, False
            async for event in source.aiter_sse():
                if kind == "disconnect" and event.data.startswith("{"):
                    return kind, r.status_code, time.perf_counter() - started, True
                done = done or event.data.strip() == "[DONE]"
            return kind, r.status_code, time.perf_counter() - started, done
    if kind == "poison":
        r = await client.post(CHAT, content=POISON[i % len(POISON)].encode(),
                              headers={"content-type": "application/json"})
        return kind, r.status_code, time.perf_counter() - started, 400 <= r.status_code < 500
    unknown = not answered or i % 7 == 0
    rid = f"never-served-{i}" if unknown else answered[i % len(answered)]
    r = await client.post("/v1/feedback", json={"request_id": rid, "rating": -1 if i % 2 else 1,
                                                "correction": None if i % 3 else "It arrives on Tuesday."})
    return kind, r.status_code, time.perf_counter() - started, r.status_code == (404 if unknown else 200)


async def _soak(url: str, headers: dict, seconds: float, clients: int, window_s: float, pid: int | None,
                max_tokens: int) -> dict:
    import httpx

    results: list[tuple[float, str, int, float, bool]] = []
    answered: list[str] = []
    samples: list[tuple[float, float]] = []
    start = time.monotonic()
    stop = start + seconds

    async def client_loop(c: int, http) -> None:
        i, n = c, 0
        while time.monotonic() < stop:
            kind = MIX[(c + n) % len(MIX)]  # every client walks the whole mix
            n += 1
            try:
                outcome = await _one(http, kind, i, answered, max_tokens)
            except httpx.HTTPError as err:  # no answer at all: counted as a 5xx-like failure (status 0)
                outcome = (kind, 0, 0.0, False)
                print(f"soak: {kind} request {i} got no answer: {err!r}")
            results.append((time.monotonic() - start, *outcome))
            i += clients

    async def sampler() -> None:
        while time.monotonic() < stop:
            if pid is not None:
                samples.append((time.monotonic() - start, rss_mb(pid)))
            await asyncio.sleep(min(1.0, window_s / 4))

    limits = httpx.Limits(max_connections=clients * 2, max_keepalive_connections=clients * 2)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as http:
        await asyncio.gather(sampler(), *(client_loop(c, http) for c in range(clients)))
    return _windows(results, samples, window_s, seconds)


def _windows(results: list, samples: list, window_s: float, seconds: float) -> dict:
    count = max(1, int(seconds // window_s))
    windows = []
    for w in range(count):
        lo, hi = w * window_s, (w + 1) * window_s if w < count - 1 else float("inf")
        rows = [r for r in results if lo <= r[0] < hi]
        lat = sorted(r[3] * 1000 for r in rows if r[1] in ("chat", "stream") and r[2] == 200)
        rss = [m for t, m in samples if lo <= t < hi]
        windows.append({
            "window": w, "requests": len(rows), "rss_mb": round(max(rss), 1) if rss else None,
            "p50_ms": round(statistics.median(lat), 1) if lat else None,
            "p95_ms": round(lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))], 1) if lat else None,
            "errors_5xx": sum(1 for r in rows if r[2] >= 500 or r[2] == 0),
            "unexpected": sum(1 for r in rows if not r[4]),
        })
    kinds: dict = {}
    for _, kind, status, _, _ in results:
        kinds.setdefault(kind, {}).setdefault(str(status), 0)
        kinds[kind][str(status)] += 1
    return {"seconds": seconds, "windows": windows, "drift": drift(windows), "by_kind": kinds,
            "requests": len(results), "unexpected": sum(1 for r in results if not r[4]),
            "errors_5xx": sum(1 for r in results if r[2] >= 500 or r[2] == 0)}


def drift(windows: list[dict]) -> dict:
    """Last third against first third of the windows after the warm-up one."""
    steady = windows[1:] if len(windows) > 2 else windows
    third = max(1, len(steady) // 3)
    first, last = steady[:third], steady[-third:]

    def mean(ws, key):
        values = [w[key] for w in ws if w[key] is not None]
        return statistics.fmean(values) if values else None

    def ratio(key):
        a, b = mean(first, key), mean(last, key)
        return round(b / a, 3) if a and b is not None else None

    def error_rate(ws):
        n = sum(w["requests"] for w in ws)
        return round(sum(w["errors_5xx"] for w in ws) / n, 4) if n else None

    return {"rss_ratio": ratio("rss_mb"), "p50_ratio": ratio("p50_ms"), "p95_ratio": ratio("p95_ms"),
            "error_rate_first": error_rate(first), "error_rate_last": error_rate(last)}


def soak(url: str, *, seconds: float = 60.0, headers: dict | None = None, clients: int = 4, window_s: float = 10.0,
         pid: int | None = None, max_tokens: int = 8) -> dict:
    """Run the mixed load for `seconds`; returns windows, drift and counts (see the module docstring)."""
    return asyncio.run(_soak(url, headers or {}, seconds, clients, window_s, pid, max_tokens))


def render(report: dict) -> str:
    lines = [f"soak {report['seconds']:.0f} s: {report['requests']} requests, {report['errors_5xx']} 5xx, "
             f"{report['unexpected']} unexpected"]
    lines += [f"  window {w['window']:2}: {w['requests']:4} req  RSS {w['rss_mb']} MB  p50/p95 {w['p50_ms']}/"
              f"{w['p95_ms']} ms  5xx {w['errors_5xx']}  unexpected {w['unexpected']}" for w in report["windows"]]
    lines.append(f"  drift: {json.dumps(report['drift'])}")
    lines.append(f"  by kind: {json.dumps(report['by_kind'])}")
    return "\n".join(lines)
