"""The model slot: versions swap atomically under streaming load; /ready tells a loaded, answering model."""

from __future__ import annotations

import json
import threading
import time

import pytest

from mlops.profile import load_profile


@pytest.fixture(scope="module")
def profile(tiny_model):
    return load_profile(tiny_model["path"])


def _stream(client, url: str, results: list, first_chunk: threading.Event, index: int) -> None:
    body = {"messages": [{"role": "user", "content": f"Tell me a long story number {index}"}], "max_tokens": 200,
            "temperature": 0, "stream": True}
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
        events = []
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
                first_chunk.set()
        results[index] = (response.status_code, response.headers.get("x-model-version"), events)


@pytest.mark.parametrize("engine_name", ["hf", "llamacpp"])
def test_swap_under_streaming_load_fails_no_request_and_drains_the_old_engine(tiny_model, profile, engine_name,
                                                                              request, monkeypatch):
    import httpx

    from serving.config import ServeConfig
    from serving.server import create_app
    from serving.testing import serve_in_thread
    from tests.conftest import build_test_engine

    gguf = request.getfixturevalue("tiny_gguf") if engine_name == "llamacpp" else None
    if gguf is not None:  # the swapped-in version converts the same folder: the cached GGUF
        monkeypatch.setenv("MLOPS_GGUF_DIR", str(gguf.parent.parent))
    old = build_test_engine(engine_name, tiny_model, gguf)
    config = ServeConfig(engine=engine_name, llamacpp={"quantization": "f16", "parallel": 4, "context_per_slot": 512})
    app = create_app(tiny_model["path"], profile.model_copy(update={"max_context": 512}), model_name="bot",
                     engine=old, version="1", config=config)
    slot = app.state.slot
    with serve_in_thread(app) as url, httpx.Client() as client:
        results: list = [None] * 4
        started = [threading.Event() for _ in range(4)]
        threads = [threading.Thread(target=_stream, args=(client, url, results, started[i], i)) for i in range(4)]
        for t in threads:
            t.start()
        assert all(event.wait(60) for event in started), "not every stream started"
        assert slot.inflight() == 4
        new = slot.load_and_swap(tiny_model["path"], profile.model_copy(update={"max_context": 512}), "2")
        assert slot.current is new and new.version == "2"
        after = client.post(f"{url}/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
        for t in threads:
            t.join(120)
        models = client.get(f"{url}/v1/models").json()["data"][0]
    assert after.status_code == 200 and after.headers["x-model-version"] == "2"
    assert models["version"] == "2" and models["id"] == "bot"
    for status, version, events in results:  # every in-flight stream finished, on the version it started on
        assert status == 200 and version == "1"
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    deadline = time.monotonic() + 30
    while old.alive() and time.monotonic() < deadline:  # closed once its last request returned its lease
        time.sleep(0.05)
    assert not old.alive()


def test_swap_closes_an_idle_old_engine_at_once_and_keeps_a_busy_one_until_released(profile):
    from serving.slot import ModelSlot

    class FakeEngine:
        def __init__(self):
            self.closed = threading.Event()

        def close(self):
            self.closed.set()

    slot = ModelSlot("bot")
    first, second, third = FakeEngine(), FakeEngine(), FakeEngine()
    slot.swap(first, profile, "1")
    lease = slot.acquire()
    slot.swap(second, profile, "2")
    assert lease.version == "1" and not first.closed.wait(0.2)  # a request still runs on version 1
    slot.release(lease)
    assert first.closed.wait(5)
    slot.swap(third, profile, "3")
    assert second.closed.wait(5)  # nobody was using version 2
    assert slot.acquire().version == "3"


def test_a_model_that_fails_to_load_or_mismatches_its_profile_never_replaces_the_serving_one(tiny_model, profile):
    from serving.slot import ModelSlot, SlotError

    slot = ModelSlot("bot")
    slot.swap(object(), profile, "1")

    def broken(_path, _profile):
        raise OSError("weights truncated")

    with pytest.raises(SlotError, match="could not be loaded"):
        slot.load_and_swap(tiny_model["path"], profile, "2", engine_factory=broken)
    wrong = profile.model_copy(update={"chat_template_hash": "0" * 64})
    with pytest.raises(SlotError, match="chat template"):
        slot.load_and_swap(tiny_model["path"], wrong, "3")
    assert slot.current.version == "1"


def test_ready_reports_a_loaded_answering_model_and_health_only_the_process(tiny_model, profile):
    from fastapi.testclient import TestClient

    from serving.config import ServeConfig
    from serving.engines.hf.engine import Engine
    from serving.server import build_app
    from serving.slot import ModelSlot

    slot = ModelSlot("bot")
    app = build_app(slot, ServeConfig())
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        empty = client.get("/ready")
        assert empty.status_code == 503 and empty.json()["reason"] == "no model loaded"
        assert client.post("/v1/completions", json={"prompt": "hi"}).json()["error"]["code"] == "model_not_loaded"
        engine = Engine(tiny_model["path"])
        slot.swap(engine, profile, "7")
        ready = client.get("/ready")
        assert ready.status_code == 200 and ready.json()["version"] == "7"
        engine.close()  # the worker is gone: the process lives, the model does not answer
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 503
