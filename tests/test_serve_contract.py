"""The response contract: 500s that carry the request id and one traceback, multi-byte echo tokens, model
lookup by id, usage only when asked in streams, and streamed logprobs."""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future

import pytest

from mlops.profile import load_profile
from serving.engines.hf.detokenize import REPLACEMENT


@pytest.fixture(scope="module")
def engine(any_engine):
    """Each engine in turn (`hf`, `llamacpp`): the guarantees here hold on every engine."""
    return any_engine


@pytest.fixture(scope="module")
def client(tiny_model, engine):
    from fastapi.testclient import TestClient

    from serving.server import create_app

    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="support-bot/3", engine=engine,
                     version="3")
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _events(response) -> list:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def test_an_internal_error_is_a_500_with_the_request_id_one_traceback_and_no_internal_text(
        tiny_model, monkeypatch, caplog, capfd):
    import httpx

    from serving.engines.hf.engine import Engine
    from serving.server import create_app
    from serving.testing import serve_in_thread

    engine = Engine(tiny_model["path"])  # closed with the app
    def broken_score(*_args, **_kwargs):
        future = Future()
        future.set_exception(RuntimeError("secret internal detail 42"))
        return future

    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="tiny", engine=engine)
    monkeypatch.setattr(engine, "score", broken_score)
    caplog.set_level(logging.INFO)
    with serve_in_thread(app) as url:
        response = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3], "echo": True, "max_tokens": 1,
                                                             "logprobs": 1}, timeout=60)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    rid = response.headers["x-request-id"]
    assert response.status_code == 500 and response.json()["request_id"] == rid
    assert "secret internal detail" not in response.text and rid in response.json()["error"]["message"]
    logged = caplog.text + capfd.readouterr().err
    assert logged.count("Traceback") == 1 and "secret internal detail 42" in logged
    assert any(rid in r.getMessage() and r.exc_info for r in caplog.records)


def test_echoed_multibyte_characters_decode_whole(client):
    text = "日本語 café ✓ naïve"
    out = client.post("/v1/completions", json={"prompt": text, "echo": True, "logprobs": 3, "max_tokens": 1,
                                               "temperature": 0}).json()
    lp = out["choices"][0]["logprobs"]
    echoed = lp["tokens"][:-1]
    assert "".join(echoed) == text
    assert not any(REPLACEMENT in t for t in lp["tokens"])
    assert lp["text_offset"][: len(echoed)] == [sum(len(t) for t in echoed[:i]) for i in range(len(echoed))]
    for top in lp["top_logprobs"][1:]:
        assert not any(REPLACEMENT in key for key in top) and len(top) == 3


def test_models_are_listed_and_looked_up_by_id_with_the_version_serving(client):
    listed = client.get("/v1/models")
    assert listed.json()["data"][0]["id"] == "support-bot/3" and listed.headers["x-model-version"] == "3"
    one = client.get("/v1/models/support-bot/3")
    assert one.status_code == 200 and one.json()["version"] == "3" and one.json()["object"] == "model"
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/completions", {"prompt": "Hi there"}),
])
def test_stream_usage_comes_in_a_final_chunk_with_empty_choices_only_when_asked(client, path, body):
    common = {**body, "max_tokens": 5, "stream": True}
    with client.stream("POST", path, json={**common, "stream_options": {"include_usage": True}}) as response:
        asked = [json.loads(e) for e in _events(response)[:-1]]
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] >= 1
    assert all(chunk["usage"] is None for chunk in asked[:-1])
    with client.stream("POST", path, json=common) as response:
        plain = [json.loads(e) for e in _events(response)[:-1]]
    assert all(chunk["choices"] and "usage" not in chunk for chunk in plain)


def test_streamed_completion_logprobs_cover_the_streamed_text(client):
    body = {"prompt": "The weather today is", "max_tokens": 8, "temperature": 0, "logprobs": 2}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        chunks = [json.loads(e) for e in _events(response)[:-1]]
    blocks = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    tokens = [t for b in blocks for t in b["tokens"]]
    assert "".join(tokens) == whole["text"] == "".join(c["choices"][0]["text"] for c in chunks)
    assert [lp for b in blocks for lp in b["token_logprobs"]] == pytest.approx(
        whole["logprobs"]["token_logprobs"], abs=1e-4)
    assert all(len(top) == 2 for b in blocks for top in b["top_logprobs"])


def test_streamed_chat_logprobs_match_the_whole_answer(client):
    body = {"messages": [{"role": "user", "content": "Say something"}], "max_tokens": 6, "temperature": 0,
            "logprobs": True, "top_logprobs": 2}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        chunks = [json.loads(e) for e in _events(response)[:-1]]
    entries = [e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in entries] == [e["token"] for e in whole["logprobs"]["content"]]
    assert "".join(e["token"] for e in entries) == whole["message"]["content"]
    assert all(len(e["top_logprobs"]) == 2 and isinstance(e["bytes"], list) for e in entries)
