"""The whole rollback with a real server: `mlops serve --follow` switches on promotion and back on rollback,
while a client streaming requests all along sees no failure."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


def _client_loop(url: str, stop: threading.Event, seen: list, failures: list) -> None:
    import httpx

    body = {"messages": [{"role": "user", "content": "Where is my order?"}], "max_tokens": 4, "stream": True}
    with httpx.Client(timeout=60) as http:
        while not stop.is_set():
            try:
                with http.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
                    chunks = [line for line in resp.iter_lines() if line.startswith("data:")]
                    if resp.status_code != 200 or not chunks or chunks[-1].strip() != "data: [DONE]":
                        failures.append((resp.status_code, chunks[-1:] if chunks else resp.read()[:200]))
                    seen.append(resp.headers.get("x-model-version"))
            except httpx.HTTPError as err:
                failures.append(repr(err))


def _wait_for_version(seen: list, version: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if seen and seen[-1] == version:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"serving never switched to version {version}; last seen {seen[-5:]}")


@pytest.mark.slow
def test_served_model_follows_promotion_and_rollback_without_failing_a_request(mlops_home, tiny_model, tmp_path):
    import httpx

    from mlops.files import free_port
    from mlops.model_refs import model_content_id, resolve_model_ref
    from mlops.tracking import init_experiment
    from registry.release import register, rollback
    from registry.testing import make_identities, release_version, training_run

    init_experiment("registry-test")
    who = make_identities()
    v1, v2 = (register(who["tina"], training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=i), "bot")
              for i in (1, 2))
    release_version(who, "bot", v1)
    port, log_path = free_port(), tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mlops", "serve", "--model", "models:/bot@production",
                                 "--follow", "--poll-interval", "0.5", "--no-auth", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    stop, seen, failures = threading.Event(), [], []
    client = None
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        client = threading.Thread(target=_client_loop, args=(url, stop, seen, failures))
        client.start()
        _wait_for_version(seen, v1, 30)
        content_v1 = model_content_id(resolve_model_ref(f"models:/bot/{v1}").hf_dir)
        release_version(who, "bot", v2, champion=(v1, content_v1))
        promoted_in = _wait_for_version(seen, v2, 60)
        rollback(who["bob"], "bot", "v2 regressed in production")
        rolled_back_in = _wait_for_version(seen, v1, 60)
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
    finally:
        stop.set()
        if client is not None:
            client.join(timeout=60)
        proc.terminate()
        proc.wait(timeout=60)
    assert failures == [], failures
    assert promoted_in < 60 and rolled_back_in < 60
    assert "following bot@production" in log_path.read_text()
