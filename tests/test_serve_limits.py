"""Large and abandoned requests against a real server: body limits, CPU work off the event loop, cancellation
on disconnect for non-streaming requests, and one poisoned request among many innocent ones."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from mlops.profile import load_profile


@pytest.fixture(scope="module")
def served(tiny_model, any_engine):
    """A real server on each engine in turn (`hf`, `llamacpp`)."""
    from serving.config import ServeConfig
    from serving.server import create_app
    from serving.testing import serve_in_thread

    engine = any_engine
    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="tiny", engine=engine,
                     config=ServeConfig(max_body_bytes=64 * 1024))
    with serve_in_thread(app) as url:
        yield url, engine


def test_a_body_over_the_limit_gets_413_naming_the_limit(served):
    import httpx

    url, _ = served
    big = {"prompt": "word " * 20000, "max_tokens": 1}
    response = httpx.post(f"{url}/v1/completions", json=big, timeout=60)
    assert response.status_code == 413
    assert "65536 bytes" in response.json()["error"]["message"] and response.headers["x-request-id"]

    def chunks():  # no Content-Length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    streamed = httpx.post(f"{url}/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                          timeout=60)
    assert streamed.status_code == 413
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_tokenization_runs_off_the_event_loop_so_health_answers_meanwhile(served, monkeypatch):
    import httpx

    url, engine = served
    inside, release = threading.Event(), threading.Event()
    real = engine.tokenize

    def slow_tokenizer(text, *args, **kwargs):
        if isinstance(text, str) and text.startswith("SLOW"):
            inside.set()
            release.wait(30)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(engine, "tokenize", slow_tokenizer)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("r", httpx.post(
        f"{url}/tokenize", json={"prompt": "SLOW " * 1000}, timeout=60)))
    worker.start()
    try:
        assert inside.wait(30)
        # The tokenizer is busy for this request; on the event loop it would block the health check too.
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        assert httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1},
                          timeout=10).status_code == 200
    finally:
        release.set()
        worker.join(30)
    assert result["r"].status_code == 200 and result["r"].json()["count"] > 1000


def test_a_non_streaming_request_whose_client_disconnects_is_cancelled(served, monkeypatch):
    url, engine = served
    jobs = []
    real = engine.generate

    def spy(*args, **kwargs):
        job = real(*args, **kwargs)
        jobs.append(job)
        return job

    monkeypatch.setattr(engine, "generate", spy)
    host, port = url.removeprefix("http://").split(":")
    body = b'{"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}'  # within every engine's context
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 30
        while not jobs and time.monotonic() < deadline:
            time.sleep(0.02)
        assert jobs, "the request never reached the engine"
    # the client is gone: the generation stops long before its 400 tokens
    result = jobs[0].future
    deadline = time.monotonic() + 30
    while not result.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert result.done()
    assert jobs[0].cancelled.is_set() or result.cancelled()
    if not result.cancelled():
        assert result.result().finish_reason == "cancelled" and len(result.result().tokens) < 400


def test_poisoned_requests_among_innocent_ones_fail_alone(served):
    import httpx

    url, _ = served
    poison = [{"prompt": "hi", "seed": 2**64}, {"prompt": "a\ud800"}, {"prompt": "hi", "temperature": 1e-300, "max_tokens": 4},
              {"prompt": [[1, 2], [10**12]]}, {"prompt": "x", "max_tokens": True}]
    innocent = {"prompt": "Where is my parcel?", "max_tokens": 4, "temperature": 0}
    results: list = []
    lock = threading.Lock()

    client = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=32))

    def send(body) -> None:
        if "\ud800" in str(body.get("prompt")):
            response = client.post(f"{url}/v1/completions", content='{"prompt": "a\\ud800"}',
                                   headers={"content-type": "application/json"})
        else:
            response = client.post(f"{url}/v1/completions", json=body)
        with lock:
            results.append((body is innocent, response.status_code, response.text))

    bodies = [innocent] * 12 + poison
    threads = [threading.Thread(target=send, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    client.close()
    innocent_codes = [code for is_innocent, code, _ in results if is_innocent]
    assert innocent_codes == [200] * 12
    for is_innocent, code, text in results:
        assert code != 500, text
        assert is_innocent or code in (200, 400), text
