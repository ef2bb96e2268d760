"""`mlops serve` as a process: SIGTERM drains running requests and exits 0; the drain timeout cuts the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest


def _start(model: str, log_path, drain: float, engine: str = "hf", gguf_dir=None):
    from serving.process import free_port

    port = free_port()
    log = open(log_path, "wb")  # noqa: SIM115 - closed by the caller after the process ends
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"MLOPS_GGUF_DIR": str(gguf_dir)} if gguf_dir else {})}
    proc = subprocess.Popen([sys.executable, "-m", "mlops", "serve", "--model", model, "--no-auth", "--port", str(port),
                             "--drain-timeout", str(drain), "--engine", engine, "serve.llamacpp.quantization=f16"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, open(log_path).read()
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise AssertionError(f"server not ready: {open(log_path).read()}")


def _stream(url: str, max_tokens: int, out: dict, first: threading.Event) -> None:
    import httpx

    events = []
    try:
        with httpx.stream("POST", f"{url}/v1/completions", timeout=120, json={
                "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    first.set()
    except httpx.HTTPError as err:
        out["error"] = err
    out["events"] = events


def _llama_servers_of(proc) -> list:
    """The llama-server processes a gateway started (by process tree: other tests' servers are not its own)."""
    import psutil

    return [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name() == "llama-server"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["hf", "llamacpp"])
def test_sigterm_drains_running_requests_exits_zero_and_the_drain_timeout_cuts_the_rest(tiny_model, mlops_home,
                                                                                       tmp_path, engine, request):
    gguf_dir = request.getfixturevalue("tiny_gguf").parent.parent if engine == "llamacpp" else None
    proc, url, log = _start(tiny_model["path"], tmp_path / "clean.log", drain=60, engine=engine, gguf_dir=gguf_dir)
    out, first = {}, threading.Event()
    client = threading.Thread(target=_stream, args=(url, 400, out, first))
    client.start()
    assert first.wait(60)
    proc.send_signal(signal.SIGTERM)
    client.join(120)
    assert proc.wait(120) == 0  # a clean drain, not -15
    log.close()
    text = (tmp_path / "clean.log").read_text()
    assert out["events"][-1] == "[DONE]", text
    assert json.loads(out["events"][-2])["choices"][0]["finish_reason"] in ("stop", "length")
    assert "AUTH IS OFF" in text and "drained cleanly" in text

    proc, url, log = _start(tiny_model["path"], tmp_path / "cut.log", drain=0.5, engine=engine, gguf_dir=gguf_dir)
    out, first = {}, threading.Event()
    client = threading.Thread(target=_stream, args=(url, 2000, out, first))
    client.start()
    assert first.wait(60)
    engine_servers = _llama_servers_of(proc)
    assert len(engine_servers) == (1 if engine == "llamacpp" else 0)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 1  # requests were cut: not a clean drain
    client.join(60)
    log.close()
    assert time.monotonic() - started < 30
    assert "[DONE]" not in out["events"]
    assert "cut 1 request" in (tmp_path / "cut.log").read_text()
    assert not any(server.is_running() for server in engine_servers)  # it went with the process
