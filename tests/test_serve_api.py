"""The OpenAI-compatible server in-process (FastAPI TestClient): contract, profile, request ids, bad input; on
every engine (`hf` and `llamacpp`)."""

from __future__ import annotations

import json
import threading

import pytest

from mlops.profile import DeploymentProfile, SamplingParams, load_profile


@pytest.fixture(scope="module")
def engine(any_engine):
    return any_engine


@pytest.fixture(scope="module")
def profile(tiny_model) -> DeploymentProfile:
    base = load_profile(tiny_model["path"])
    return base.model_copy(update={"system_prompt": "You are the Northwind support assistant.", "max_context": 256,
                                   "sampling": SamplingParams(temperature=0.0, max_tokens=8, seed=7)})


@pytest.fixture(scope="module")
def client(tiny_model, engine, profile):
    from fastapi.testclient import TestClient

    from serving.server import create_app

    app = create_app(tiny_model["path"], profile, model_name="tiny", engine=engine)
    with TestClient(app) as c:  # no lifespan exit here: the engine is shared by the module
        yield c


def test_health_models_and_tokenizer_info_describe_the_served_model(client, profile):
    assert client.get("/health").json() == {"status": "ok", "model": "tiny", "version": "tiny"}
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 256
    assert models["data"][0]["profile_hash"] == profile.profile_hash()
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and info["chat_template_hash"] == profile.chat_template_hash
    tokens = client.post("/tokenize", json={"prompt": "hello world"}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": tokens}).json()["prompt"] == "hello world"


def test_echo_logprobs_follow_the_lm_eval_loglikelihood_contract(client, engine):
    prompts = [[1, 504, 2330, 314, 260], [4093, 28, 905]]
    body = {"model": "tiny", "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
            "echo": True}
    out = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for prompt, choice in zip(prompts, out["choices"], strict=True):
        lp = choice["logprobs"]
        # one entry per prompt token (the first is null) plus the one generated token
        assert len(lp["token_logprobs"]) == len(prompt) + 1 and lp["token_logprobs"][0] is None
        assert lp["top_logprobs"][0] is None and len(lp["top_logprobs"]) == len(prompt) + 1
        for tok_lp, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
            assert tok_lp <= max(top.values()) + 1e-9 < 0  # lm-eval's is_greedy test compares these
        # the generated token is the greedy one, so its logprob is the top one
        assert lp["token_logprobs"][-1] == max(lp["top_logprobs"][-1].values())
    assert out["usage"]["prompt_tokens"] == 8


def test_string_prompts_are_tokenized_without_bos(client, engine):
    ids = engine.tokenize("The capital of France is")
    as_text = client.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 1,
                                                   "logprobs": 1, "echo": True, "temperature": 0}).json()
    as_ids = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1, "logprobs": 1, "echo": True,
                                                  "temperature": 0}).json()
    assert as_text["choices"][0]["logprobs"] == as_ids["choices"][0]["logprobs"]


def test_profile_supplies_system_prompt_and_sampling_defaults(client, engine, profile):
    from serving.api_schema import ChatRequest
    from serving.completions import View, chat_ids
    from serving.config import ServeConfig

    view = View("tiny", client.app.state.slot.current, ServeConfig())
    ids = chat_ids(view, ChatRequest(messages=[{"role": "user", "content": "Where is my order?"}]))
    assert profile.system_prompt in engine.detokenize(ids)
    out = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert out["usage"]["completion_tokens"] <= profile.sampling.max_tokens  # the profile's default length
    again = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert out["choices"][0]["message"] == again["choices"][0]["message"]  # greedy by the profile: deterministic


def test_sampling_with_a_seed_is_reproducible(client):
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "top_p": 0.9, "seed": 42}
    first = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert client.post("/v1/completions", json=body).json()["choices"][0]["text"] == first


def test_stop_strings_cut_the_completion(client):
    free = client.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 8}).json()["choices"][0]["text"]
    assert len(free) > 2
    stop = free[1:3]
    cut = client.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 8, "stop": [stop]}).json()
    assert cut["choices"][0]["text"] == free[: free.index(stop)] and cut["choices"][0]["finish_reason"] == "stop"


def test_every_response_carries_a_request_id_and_a_given_one_is_kept(client):
    response = client.get("/health")
    assert len(response.headers["X-Request-ID"]) == 32
    response = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers={"X-Request-ID": "abc-123"})
    assert response.headers["X-Request-ID"] == "abc-123" and response.json()["id"] == "cmpl-abc-123"


def test_chat_streaming_sends_deltas_then_done(client):
    with client.stream("POST", "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "stream": True,
    }) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    whole = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hello"}],
                                                      "max_tokens": 6}).json()
    assert streamed == whole["choices"][0]["message"]["content"]


def test_concurrent_scoring_requests_are_batched_and_answered_correctly(client, engine):
    prompts = [[1, 2, 3, 4 + i] for i in range(12)]
    alone = [client.post("/v1/completions", json={"prompt": p, "max_tokens": 1, "logprobs": 1, "echo": True})
             .json()["choices"][0]["logprobs"]["token_logprobs"] for p in prompts]
    before = len(getattr(engine, "batches", []))  # the hf engine counts its scoring passes
    results: dict[int, list] = {}

    def call(i: int) -> None:
        body = {"prompt": prompts[i], "max_tokens": 1, "logprobs": 1, "echo": True}
        results[i] = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["token_logprobs"]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, expected in enumerate(alone):
        assert results[i][0] is None
        assert results[i][1:] == pytest.approx(expected[1:], abs=1e-5)
    if hasattr(engine, "batches"):
        assert len(engine.batches) - before <= len(prompts)  # never more forward passes than requests


BAD = [
    ("/v1/completions", "{not json", "invalid_json"),
    ("/v1/completions", {"model": "tiny"}, "invalid_request"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, "model_not_found"),
    ("/v1/completions", {"prompt": [5] * 300}, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "invalid_request"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, "invalid_request"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**9}, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, "invalid_request"),
    ("/v1/completions", {"prompt": {"text": "hi"}}, "invalid_request"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "invalid_request"),
    ("/v1/completions", {"prompt": []}, "invalid_request"),
    ("/v1/completions", {"prompt": [10**9]}, "invalid_request"),
    ("/v1/completions", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "invalid_request"),
    ("/v1/chat/completions", {"messages": []}, "invalid_request"),
    ("/v1/chat/completions", {"messages": "hello"}, "invalid_request"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "invalid_request"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, "model_not_found"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "invalid_request"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 400}]}, "context_length_exceeded"),
]


@pytest.mark.parametrize("path,body,code", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_input_gets_a_4xx_json_error_and_the_server_keeps_serving(client, path, body, code):
    content = body if isinstance(body, str) else json.dumps(body)
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert response.json()["request_id"] == response.headers["X-Request-ID"]
    assert client.get("/health").status_code == 200
    ok = client.post("/v1/completions", json={"prompt": "still here", "max_tokens": 1})
    assert ok.status_code == 200


def test_unknown_route_is_a_json_404(client):
    response = client.get("/v2/everything")
    assert response.status_code == 404 and "error" in response.json()
