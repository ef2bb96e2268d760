"""Soak: `mlops serve --follow --shadow` under sustained mixed load (answers, streams, poison, disconnects,
feedback) keeps its memory, latency and error rate flat, logs every request, routes a ledgered canary, and drains
on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _wait_ready(proc, url: str, log_path: Path, headers: dict, timeout: float = 240) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)


def _versions_until(url: str, headers: dict, done, timeout: float = 90) -> list:
    import httpx

    seen, deadline = [], time.monotonic() + timeout
    body = {"messages": [{"role": "user", "content": "Is my refund through?"}], "max_tokens": 2}
    while not done(seen) and time.monotonic() < deadline:
        seen.append(httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
                    .headers["x-model-version"])
    return seen


@pytest.mark.slow
def test_soak_under_mixed_load_keeps_memory_latency_and_errors_flat(mlops_home, tiny_model, tmp_path):
    import httpx

    from mlops.files import free_port
    from mlops.requestlog import read_feedback, read_requests
    from mlops.tracking import init_experiment
    from registry.release import register
    from registry.testing import make_identities, release_version, training_run
    from serving.auth import add_key
    from serving.soak import render, soak
    from serving.testing import canary_start, canary_stop

    init_experiment("registry-test")
    who = make_identities()
    v1, v2 = (register(who["tina"], training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=i), "bot")
              for i in (1, 2))
    release_version(who, "bot", v1)  # v2 stays a candidate
    keys_file = tmp_path / "keys.json"
    key, _ = add_key(keys_file, "soak-client")
    headers = {"Authorization": f"Bearer {key}"}
    port, log_path = free_port(), tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mlops", "serve", "--model", "models:/bot@production",
                                 "--follow", "--shadow", "models:/bot@candidate", "--shadow-share", "0.2",
                                 "--keys-file", str(keys_file), "--port", str(port), "serve.access_log=false"],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, log_path, headers)
        seconds = float(os.environ.get("MLOPS_SOAK_SECONDS", "60"))
        report = soak(url, seconds=seconds, headers=headers, clients=4, window_s=seconds / 10, pid=proc.pid)
        print(render(report))
        metrics = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
        # the registry starts a canary of the candidate: the following server routes to it, then stops
        canary_start("bot", v2, 0.5, time.time() + 600)
        during = _versions_until(url, headers, lambda seen: v2 in seen)
        canary_stop("bot", v2)
        after = _versions_until(url, headers, lambda seen: seen[-8:] == [v1] * 8)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    text = log_path.read_text()
    assert code == 0, text[-3000:]
    assert report["errors_5xx"] == 0 and report["unexpected"] == 0, (report["by_kind"], text[-3000:])
    drift = report["drift"]
    assert drift["rss_ratio"] <= 1.25, drift  # steady state: memory does not climb
    assert drift["p50_ratio"] <= 3.0, drift  # generous: the machine is shared, a leak would show far more
    assert drift["error_rate_first"] == drift["error_rate_last"] == 0
    assert v2 in during and after[-8:] == [v1] * 8
    model_requests = sum(n for kind, codes in report["by_kind"].items() if kind != "feedback" for n in codes.values())
    users, canaries = read_requests(model="bot", role="user"), read_requests(model="bot", role="canary")
    # every request on a model route was logged, none lost at shutdown
    assert len(users) + len(canaries) == model_requests + len(during) + len(after)
    assert {r["version"] for r in users} == {v1} and {r["version"] for r in canaries} == {v2}
    assert len(canaries) == during.count(v2) + after.count(v2)
    shadows = read_requests(model="bot", role="shadow")
    assert shadows and {r["version"] for r in shadows} == {v2}
    assert {r["parent_id"] for r in shadows} <= {r["request_id"] for r in users}
    assert len(read_feedback()) == report["by_kind"]["feedback"].get("200", 0) > 0
    assert 'outcome="dropped_full"' not in metrics
    assert "following bot@production" in text and f"on version {v2}" in text
