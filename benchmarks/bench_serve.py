"""Load benchmark of `mlops serve` (asyncio + httpx against a server subprocess started here, with an API key).

1. Streaming chat at concurrency 1, 8, 32: completion tokens/s, p50/p95/p99 latency and time to first token.
2. The same levels with 5% poison requests mixed in (64-bit overflow, lone surrogates, NaN, booleans as
   integers, unsupported fields, degenerate temperatures): goal 0 innocent failures and no 500.
3. 64 streams of which a third disconnect after a few chunks, against the same surviving streams alone:
   goal: the survivors' throughput does not drop (ratio >= ~0.9) and the server's RSS comes back within 10%.
4. `--tracing`: the gateway with every answer written as an MLflow trace (the request log) against the same
   gateway with it off, side by side (off, on, on, off: drift cancels), at concurrency 1 and 16.
   Goal: tracing costs <= 5% throughput and <= 5 ms p50 TTFT at both. Each level starts once the trace writer
   has caught up with the last one. `--sustain-s S` adds c=16 for S seconds: traffic that never pauses for longer
   than the writer's idle lag, where the traces' CPU (MLflow's ORM, ~6 ms a trace here) is paid while serving.

Traffic goes only to a server this script starts on 127.0.0.1. The load average is printed before and after:
on a shared 2-core machine only runs that start quiet are comparable.

    python benchmarks/bench_serve.py                     # tiny model and SmolLM2 (`make bench`)
    python benchmarks/bench_serve.py --models tiny --requests 64 --max-tokens 32
    python benchmarks/bench_serve.py --models tiny --tracing      # tracing on vs off only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from serving.loadgen import CHAT
from serving.loadgen import chat_body as _body
from serving.loadgen import percentile as _percentile
from serving.loadgen import stream_once as _stream

POISON = [  # (raw JSON body, what it tests); every one must fail alone (400) or be served (200), never 500
    ('{"messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}', "seed beyond 64 bits"),
    ('{"messages": [{"role": "user", "content": "bad \\ud800 text"}]}', "lone surrogate"),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "NaN temperature"),
    ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": true}', "boolean as integer"),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e-300, "max_tokens": 8}', "tiny temperature"),
    ('{"messages": [{"role": "user", "content": "hi"}], "n": 3}', "unsupported n"),
    ('{"messages": [{"role": "user", "content": "hi"}], "top_p": 1e-300, "temperature": 2, "max_tokens": 8}',
     "degenerate top_p"),
]


async def _raw(client, raw: str) -> int:
    response = await client.post(CHAT, content=raw.encode(), headers={"content-type": "application/json"})
    return response.status_code


async def _level(client, concurrency: int, requests: int, max_tokens: int, poison_share: float = 0.0) -> dict:
    gate = asyncio.Semaphore(concurrency)
    every = round(1 / poison_share) if poison_share else 0  # 5%: every 20th request, spread through the run
    plan = ["poison" if every and i % every == every - 1 else "innocent" for i in range(requests)]

    async def one(i: int, kind: str):
        async with gate:
            if kind == "poison":
                raw, label = POISON[(i // every) % len(POISON)]
                return kind, label, await _raw(client, raw)
            return kind, None, await _stream(client, _body(i, max_tokens))

    started = time.perf_counter()
    results = await asyncio.gather(*(one(i, k) for i, k in enumerate(plan)))
    wall = time.perf_counter() - started
    innocent = [r for kind, _, r in results if kind == "innocent"]
    good = [r for r in innocent if r["status"] == 200 and r["done"]]
    poison = [(label, code) for kind, label, code in results if kind == "poison"]
    return {
        "concurrency": concurrency, "requests": requests, "wall_s": wall,
        "tokens_per_s": sum(r["tokens"] for r in good) / wall,
        "p50_ms": 1000 * _percentile([r["latency"] for r in good], 50),
        "p95_ms": 1000 * _percentile([r["latency"] for r in good], 95),
        "p99_ms": 1000 * _percentile([r["latency"] for r in good], 99),
        "ttft_p50_ms": 1000 * _percentile([r["ttft"] for r in good if r["ttft"]], 50),
        "ttft_p95_ms": 1000 * _percentile([r["ttft"] for r in good if r["ttft"]], 95),
        "ttft_p99_ms": 1000 * _percentile([r["ttft"] for r in good if r["ttft"]], 99),
        "innocent_failures": len(innocent) - len(good), "poison": poison,
        "poison_500s": sum(1 for _, code in poison if code >= 500),
    }


async def _disconnects(client, rss, streams: int, max_tokens: int) -> dict:
    survivors = streams - streams // 3

    async def run(n_total: int, n_leaving: int) -> tuple[float, list]:
        started = time.perf_counter()
        results = await asyncio.gather(*(
            _stream(client, _body(i, max_tokens), disconnect_after=3 if i < n_leaving else None)
            for i in range(n_total)))
        kept = [r for r in results if r["status"] != "disconnected"]
        return time.perf_counter() - started, kept

    base_wall, base = await run(survivors, 0)
    before = rss()
    wall, kept = await run(streams, streams // 3)
    await asyncio.sleep(2.0)  # let cancelled rows leave the engine
    after = rss()
    base_tps = sum(r["tokens"] for r in base) / base_wall
    tps = sum(r["tokens"] for r in kept) / wall
    return {"streams": streams, "leaving": streams // 3, "survivor_tokens_per_s": tps,
            "alone_tokens_per_s": base_tps, "ratio": tps / base_tps if base_tps else float("nan"),
            "survivor_failures": sum(1 for r in kept if not (r["status"] == 200 and r["done"])),
            "rss_before_mb": before / 2**20, "rss_after_mb": after / 2**20, "rss_ratio": after / before}


async def _bench(server, args) -> dict:
    import httpx
    import psutil

    proc = psutil.Process(server.proc.pid)
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=600, limits=limits) as client:
        await _stream(client, _body(0, args.max_tokens))  # warm up
        levels = [await _level(client, c, max(args.requests, c), args.max_tokens) for c in (1, 8, 32)]
        # the same levels with 5% poison: enough requests that every poison kind appears once
        poisoned = [await _level(client, c, max(args.requests, 20 * len(POISON)), args.max_tokens,
                                 poison_share=0.05) for c in (1, 8, 32)]
        leaving = await _disconnects(client, lambda: proc.memory_info().rss, 64, args.max_tokens * 4)
    return {"levels": levels, "poison": poisoned, "disconnects": leaving}


def _print(name: str, report: dict) -> None:
    for r in report["levels"]:
        print(f"{name:8} c={r['concurrency']:<2} {r['tokens_per_s']:8.1f} tok/s  latency p50/p95/p99 "
              f"{r['p50_ms']:6.0f}/{r['p95_ms']:6.0f}/{r['p99_ms']:6.0f} ms  TTFT p50/p95/p99 "
              f"{r['ttft_p50_ms']:6.0f}/{r['ttft_p95_ms']:6.0f}/{r['ttft_p99_ms']:6.0f} ms  "
              f"failures {r['innocent_failures']}")
    for p in report["poison"]:
        codes: dict = {}
        for label, code in p["poison"]:
            codes.setdefault(f"{label} -> {code}", 0)
            codes[f"{label} -> {code}"] += 1
        clean = p["innocent_failures"] == 0 and p["poison_500s"] == 0
        print(f"{name:8} poison 5% at c={p['concurrency']:<2}: {p['tokens_per_s']:.1f} tok/s, innocent failures "
              f"{p['innocent_failures']}, poison 500s {p['poison_500s']} (goal 0 and 0: {_verdict(clean)}); "
              f"{', '.join(sorted(codes))}")
    d = report["disconnects"]
    print(f"{name:8} {d['streams']} streams, {d['leaving']} leave mid-stream: survivors {d['survivor_tokens_per_s']:.1f} "
          f"tok/s vs {d['alone_tokens_per_s']:.1f} alone (ratio {d['ratio']:.2f}, goal >= 0.9: "
          f"{_verdict(d['ratio'] >= 0.9)}), survivor failures {d['survivor_failures']}; RSS "
          f"{d['rss_before_mb']:.0f} -> {d['rss_after_mb']:.0f} MB (ratio {d['rss_ratio']:.2f}, goal <= 1.10: "
          f"{_verdict(d['rss_ratio'] <= 1.10)})")


TRACING_LEVELS = (1, 16)


async def _rows_logged(client) -> dict[str, float]:
    metrics = (await client.get("/metrics")).text
    return {line.split('outcome="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
            if line.startswith("mlops_serve_request_log_rows_total{")}


async def _caught_up(client, sent: int, timeout_s: float = 600) -> None:
    """Until the writer has attempted every row sent so far: each level starts with no backlog of the last one."""
    deadline = time.monotonic() + timeout_s
    while sum((await _rows_logged(client)).values()) < sent and time.monotonic() < deadline:
        await asyncio.sleep(0.25)


async def _traced_levels(server, args, traced: bool) -> dict:
    """The burst levels (each from an empty backlog), then, with --sustain-s, c=16 for that long: past the
    writer's idle lag (serve.request_log.idle_lag_seconds), where tracing's CPU is paid during the traffic."""
    import httpx

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=600, limits=limits) as client:
        await _stream(client, _body(0, args.max_tokens))  # warm up
        sent = 1
        levels = {}
        for c in TRACING_LEVELS:
            if traced:
                await _caught_up(client, sent)
            levels[c] = await _level(client, c, max(args.requests, 4 * c), args.max_tokens)
            sent += levels[c]["requests"]
            levels[c]["written_during"] = (await _rows_logged(client)).get("written", 0.0)
        if args.sustain_s:
            if traced:
                await _caught_up(client, sent)
            burst = levels[max(TRACING_LEVELS)]
            n = max(burst["requests"], int(args.sustain_s * burst["requests"] / burst["wall_s"]))
            levels["sustained"] = await _level(client, max(TRACING_LEVELS), n, args.max_tokens)
            sent += n
        rows = await _rows_logged(client)
    return {"levels": levels, "trace_rows": rows}


def _tracing_overhead(path: Path, args) -> dict:
    """Tracing off and on, in the order off, on, on, off; each side's figures are the mean of its two runs."""
    from mlops.profile import load_profile
    from serving.process import ServerProcess

    work = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"  # the traces' store, this run's own
    profile_file = load_profile(path).save_as(work / "profile.yaml")
    runs: dict[str, list] = {"off": [], "on": []}
    for i, side in enumerate(("off", "on", "on", "off")):
        with ServerProcess(Path(path), profile_file, "bench", work / f"server-{i}-{side}.log") as server:
            if side == "on":  # ServerProcess turns the request log off (eval traffic); here it is the subject
                server.command = [c for c in server.command if c != "serve.request_log.enabled=false"]
            server.start(600)
            runs[side].append(asyncio.run(_traced_levels(server, args, side == "on")))
    report = {}
    for c in runs["off"][0]["levels"]:
        off = [r["levels"][c] for r in runs["off"]]
        on = [r["levels"][c] for r in runs["on"]]
        mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
        report[c] = {"off_tokens_per_s": mean(off, "tokens_per_s"), "on_tokens_per_s": mean(on, "tokens_per_s"),
                     "off_ttft_p50_ms": mean(off, "ttft_p50_ms"), "on_ttft_p50_ms": mean(on, "ttft_p50_ms"),
                     "failures": sum(r["innocent_failures"] for r in off + on),
                     "seconds": mean(on, "wall_s"), "requests": on[0]["requests"]}
    trace_rows: dict = {}
    for r in runs["on"]:
        for outcome, n in r["trace_rows"].items():
            trace_rows[outcome] = trace_rows.get(outcome, 0) + n
    return {"levels": report, "trace_rows": trace_rows, "work": str(work), "runs": runs}


def _print_tracing(name: str, report: dict) -> None:
    for c, r in report["levels"].items():
        loss = 1 - r["on_tokens_per_s"] / r["off_tokens_per_s"] if r["off_tokens_per_s"] else float("nan")
        extra = r["on_ttft_p50_ms"] - r["off_ttft_p50_ms"]
        level = f"c={c:<2}" if c != "sustained" else f"c={max(TRACING_LEVELS)} for {r['seconds']:.0f} s"
        print(f"{name:8} tracing {level} off {r['off_tokens_per_s']:7.1f} tok/s, on {r['on_tokens_per_s']:7.1f} "
              f"tok/s (throughput cost {100 * loss:+.1f}%, goal <= 5%: {_verdict(loss <= 0.05)}); TTFT p50 off "
              f"{r['off_ttft_p50_ms']:.1f} ms, on {r['on_ttft_p50_ms']:.1f} ms ({extra:+.1f} ms, goal <= 5 ms: "
              f"{_verdict(extra <= 5)}); failures {r['failures']}")
    print(f"{name:8} traces during the 'on' runs by outcome: {report['trace_rows']} (store: {report['work']})")


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2 or HF folders")
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level (at least c)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--tracing", action="store_true", help="only compare tracing (the request log) on vs off")
    parser.add_argument("--sustain-s", type=float, default=0.0,
                        help="with --tracing: also a c=16 level this long (past the trace writer's idle lag)")
    args = parser.parse_args()
    from mlops.base_models import ensure_base_model
    from mlops.profile import load_profile
    from serving.process import ServerProcess

    print(f"load average before: {os.getloadavg()}")
    report = {}
    for name in [m for m in args.models.split(",") if m]:
        path = name if Path(name).is_dir() else ensure_base_model(name)["path"]
        if args.tracing:
            report[name] = _tracing_overhead(Path(path), args)
            _print_tracing(name, report[name])
            continue
        work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
        profile_file = load_profile(path).save_as(work / "profile.yaml")
        with ServerProcess(Path(path), profile_file, "bench", work / "server.log") as server:
            server.start(600)
            report[name] = asyncio.run(_bench(server, args))
        _print(name, report[name])
        print(f"server log: {work / 'server.log'}")
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.tracing:
        raise SystemExit(1 if any(lv["failures"] for r in report.values() for lv in r["levels"].values()) else 0)
    bad = sum(sum(p["innocent_failures"] + p["poison_500s"] for p in r["poison"])
              + r["disconnects"]["survivor_failures"] + sum(level["innocent_failures"] for level in r["levels"])
              for r in report.values())
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
