"""The serving cost of shadowing: the user path with and without a 20% shadow share, side by side in one run.

Two `mlops serve` processes on 127.0.0.1 serve the same model with the request log on; one also runs
`--shadow <same model> --shadow-share 0.2`. Phases alternate (plain, shadowed, plain, ...) so drift in the
machine's load hits both arms alike; only one server has traffic at a time, and each shadowed phase is followed
by a wait until the shadow queue is empty, so background work never spills into the next phase. Two load shapes:

- saturated: `--concurrency` clients back to back (the shadow mostly stands aside and drops, counted);
- paced: one client that waits as long as its last request took (about half busy: the shadow gets the gaps).

Printed per shape: throughput (requests/s) and p50/p95 latency of each arm, the p95 ratio (goal <= 1.05), and
the shadow's answered/dropped counts; the load average before and after. On a shared 2-core machine only runs
that start quiet are comparable.

    python benchmarks/bench_shadow.py                       # tiny model, ~2-4 min
    python benchmarks/bench_shadow.py --requests 80 --rounds 4 --max-tokens 24
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHAT = "/v1/chat/completions"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def _start(model: str, home: Path, name: str, extra: list[str]):
    import httpx

    from mlops.files import free_port

    port = free_port()
    log = (home / f"{name}.log").open("wb")
    env = {**os.environ, "MLOPS_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "mlops", "serve", "--model", model, "--no-auth", "--port",
                             str(port), "--name", "bench", *extra, "serve.access_log=false"], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server {name} exited: {(home / f'{name}.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"server {name} did not become ready")


def _metric(text: str, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def _phase(url: str, shape: str, requests: int, concurrency: int, max_tokens: int, offset: int) -> dict:
    import httpx

    latencies: list[float] = []
    failures = 0
    counter = iter(range(requests))

    async def client(http) -> None:
        nonlocal failures
        for i in counter:
            body = {"messages": [{"role": "user", "content": f"Order {offset + i}: where is it?"}],
                    "max_tokens": max_tokens, "temperature": 0}
            started = time.perf_counter()
            r = await http.post(CHAT, json=body)
            took = time.perf_counter() - started
            if r.status_code != 200:
                failures += 1
            latencies.append(took)
            if shape == "paced":
                await asyncio.sleep(took)  # about half busy: room for the shadow

    clients = concurrency if shape == "saturated" else 1
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - started
    return {"latencies": latencies, "wall": wall, "failures": failures}


def _wait_shadow_idle(url: str, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _metric(httpx.get(f"{url}/metrics", timeout=10).text, "mlops_serve_shadow_pending") == 0:
            return
        time.sleep(0.2)


def _run(args, plain_url: str, shadow_url: str) -> dict:
    import httpx

    report = {}
    for shape in ("saturated", "paced"):
        arms = {"plain": {"latencies": [], "wall": 0.0, "failures": 0}, "shadow": {"latencies": [], "wall": 0.0,
                                                                                   "failures": 0}}
        for r in range(args.rounds):
            order = ("plain", "shadow") if r % 2 == 0 else ("shadow", "plain")  # ABBA: no arm always goes first
            for arm in order:
                url = plain_url if arm == "plain" else shadow_url
                out = asyncio.run(_phase(url, shape, args.requests, args.concurrency, args.max_tokens, r * 1000))
                arms[arm]["latencies"] += out["latencies"]
                arms[arm]["wall"] += out["wall"]
                arms[arm]["failures"] += out["failures"]
                if arm == "shadow":
                    _wait_shadow_idle(shadow_url)
        metrics = httpx.get(f"{shadow_url}/metrics", timeout=10).text
        row = {}
        for arm, data in arms.items():
            lat = data["latencies"]
            row[arm] = {"requests": len(lat), "rps": len(lat) / data["wall"], "p50_ms": 1000 * _percentile(lat, 50),
                        "p95_ms": 1000 * _percentile(lat, 95), "failures": data["failures"]}
        row["p95_ratio"] = row["shadow"]["p95_ms"] / row["plain"]["p95_ms"]
        row["rps_ratio"] = row["shadow"]["rps"] / row["plain"]["rps"]
        row["shadow_outcomes"] = {o: _metric(metrics, "mlops_serve_shadow_requests_total", outcome=o)
                                  for o in ("answered", "dropped_busy", "timed_out", "failed")}
        report[shape] = row
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or an HF folder")
    parser.add_argument("--share", type=float, default=0.2)
    parser.add_argument("--requests", type=int, default=40, help="requests per phase")
    parser.add_argument("--rounds", type=int, default=2, help="phases per arm and shape")
    parser.add_argument("--concurrency", type=int, default=4, help="clients in the saturated shape")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    from mlops.base_models import ensure_base_model

    print(f"load average before: {os.getloadavg()}")
    model = args.model if Path(args.model).is_dir() else ensure_base_model(args.model)["path"]
    home = Path(tempfile.mkdtemp(prefix="bench-shadow-"))
    servers = []
    try:
        servers.append(_start(str(model), home, "plain", []))
        servers.append(_start(str(model), home, "shadow", ["--shadow", str(model), "--shadow-share",
                                                           str(args.share)]))
        report = _run(args, servers[0][1], servers[1][1])
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=120)
    for shape, row in report.items():
        for arm in ("plain", "shadow"):
            a = row[arm]
            print(f"{shape:9} {arm:6} {a['requests']:4} req  {a['rps']:6.2f} req/s  p50 {a['p50_ms']:7.1f} ms  "
                  f"p95 {a['p95_ms']:7.1f} ms  failures {a['failures']}")
        print(f"{shape:9} shadow {args.share:.0%}: p95 ratio {row['p95_ratio']:.3f} (goal <= 1.05: "
              f"{'met' if row['p95_ratio'] <= 1.05 else 'MISSED'}), throughput ratio "
              f"{row['rps_ratio']:.3f}; shadow outcomes so far {json.dumps(row['shadow_outcomes'])}")
    print(f"load average after: {os.getloadavg()}")
    print(f"server logs: {home}")
    if args.json:
        args.json.write_text(json.dumps({"load_after": os.getloadavg(), **report}, indent=2))
    failures = sum(row[arm]["failures"] for row in report.values() for arm in ("plain", "shadow"))
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
