"""Every malformed input gets a 400 naming the field, never a 500 with internal text; unsupported OpenAI fields
are refused instead of silently ignored; on every engine."""

from __future__ import annotations

import json

import pytest

from mlops.profile import SamplingParams, load_profile


@pytest.fixture(scope="module")
def client(tiny_model, engine_name, request):
    """The app on each engine in turn (`hf`, `llamacpp`): bad input is refused before any engine sees it."""
    from fastapi.testclient import TestClient

    from serving.config import ServeConfig
    from serving.server import create_app
    from tests.conftest import build_test_engine

    gguf = request.getfixturevalue("tiny_gguf") if engine_name == "llamacpp" else None
    profile = load_profile(tiny_model["path"]).model_copy(
        update={"max_context": 256, "sampling": SamplingParams(temperature=0.0, max_tokens=4, seed=7)})
    app = create_app(tiny_model["path"], profile, model_name="tiny", config=ServeConfig(max_prompts=4),
                     engine=build_test_engine(engine_name, tiny_model, gguf))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]

# (path, raw JSON body, the field the error must name)
BAD = [
    # strict types: booleans and strings are not integers, floats are not token ids
    (CMPL, '{"prompt": "hi", "max_tokens": true}', "max_tokens"),
    (CMPL, '{"prompt": "hi", "max_tokens": "5"}', "max_tokens"),
    (CMPL, '{"prompt": "hi", "max_tokens": 2.0}', "max_tokens"),
    (CMPL, '{"prompt": "hi", "seed": true}', "seed"),
    (CMPL, '{"prompt": "hi", "logprobs": "1"}', "logprobs"),
    (CMPL, '{"prompt": "hi", "echo": "yes"}', "echo"),
    (CMPL, '{"prompt": "hi", "stream": 1}', "stream"),
    (CMPL, '{"prompt": [1, true, 3]}', "prompt"),
    (CMPL, '{"prompt": [1.5, 2]}', "prompt"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "logprobs": "true"}', "logprobs"),
    (CHAT, '{"messages": [{"role": "user", "content": 5}]}', "messages.0.content"),
    # beyond 64 bits, and integers longer than Python parses
    (CMPL, '{"prompt": "hi", "seed": 18446744073709551616}', "seed"),
    (CMPL, '{"prompt": "hi", "seed": -9223372036854775809}', "seed"),
    (CMPL, '{"prompt": "hi", "max_tokens": 1180591620717411303424}', "max_tokens"),
    (CMPL, '{"prompt": [18446744073709551617]}', "prompt"),
    (CMPL, '{"prompt": [[5, 9223372036854775808]]}', "prompt"),
    (CMPL, '{"prompt": "hi", "logprobs": 1000000000000000000000000000000}', "logprobs"),
    ("/detokenize", '{"tokens": [9223372036854775808]}', "tokens"),
    ("/detokenize", '{"tokens": [-1]}', "tokens"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 99999999999999999999}',
     "max_completion_tokens"),
    # lone surrogates anywhere text goes
    (CMPL, '{"prompt": "hello \\ud800 world"}', "prompt"),
    (CMPL, '{"prompt": ["fine", "bad \\udfff"]}', "prompt.1"),
    (CHAT, '{"messages": [{"role": "user", "content": "x\\ud83d"}]}', "messages.0.content"),
    (CHAT, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
     "messages.0.content.0.text"),
    (CMPL, '{"prompt": "hi", "stop": ["\\ud800"]}', "stop.0"),
    (CMPL, '{"prompt": "hi", "model": "\\ud800"}', "model"),
    ("/tokenize", '{"prompt": "a\\ud800b"}', "prompt"),
    # degenerate sampling parameters
    (CMPL, '{"prompt": "hi", "temperature": NaN}', "temperature"),
    (CMPL, '{"prompt": "hi", "temperature": Infinity}', "temperature"),
    (CMPL, '{"prompt": "hi", "temperature": 1e999}', "temperature"),
    (CMPL, '{"prompt": "hi", "temperature": -0.5}', "temperature"),
    (CMPL, '{"prompt": "hi", "temperature": 2.5}', "temperature"),
    (CMPL, '{"prompt": "hi", "top_p": 0}', "top_p"),
    (CMPL, '{"prompt": "hi", "top_p": NaN}', "top_p"),
    (CMPL, '{"prompt": "hi", "top_p": 1.5}', "top_p"),
    (CMPL, '{"prompt": "hi", "logprobs": 21}', "logprobs"),
    (CMPL, '{"prompt": "hi", "logprobs": -1}', "logprobs"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}', "top_logprobs"),
    (CMPL, '{"prompt": "hi", "stream": false, "stream_options": {"include_usage": true}}', "stream_options"),
    # limits
    (CMPL, '{"prompt": ["a", "b", "c", "d", "e"]}', "prompt"),
    (CMPL, '{"prompt": [[1], [2], [3], [4], [5]]}', "prompt"),
]


def _post(client, path: str, raw: str):
    return client.post(path, content=raw.encode("utf-8"), headers={"content-type": "application/json"})


@pytest.mark.parametrize("path,raw,field", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_malformed_input_gets_a_400_naming_the_field(client, path, raw, field):
    response = _post(client, path, raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field or error["param"].startswith(f"{field}."), error
    assert field.split(".")[0] in error["message"]
    for internal in ("Traceback", "Error:", "torch", "TextEncodeInput", "Overflow"):
        assert internal not in error["message"]


def test_integers_past_the_parser_limit_and_bad_utf8_are_invalid_json(client):
    huge = _post(client, CMPL, '{"prompt": "hi", "seed": ' + "9" * 5000 + "}")
    assert huge.status_code == 400 and huge.json()["error"]["code"] == "invalid_json"
    bad_bytes = client.post(CMPL, content=b'{"prompt": "\xff\xfe"}', headers={"content-type": "application/json"})
    assert bad_bytes.status_code == 400 and bad_bytes.json()["error"]["code"] == "invalid_json"
    deep = _post(client, CMPL, '{"prompt": ' + "[" * 100000 + "]" * 100000 + "}")
    assert deep.status_code == 400


@pytest.mark.parametrize("extra", [
    {"seed": 2**63 - 1}, {"seed": -(2**63)}, {"temperature": 1e-30, "seed": 3}, {"temperature": 2.0, "top_p": 1e-9},
    {"n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "best_of": 1, "suffix": None},
])
def test_extreme_but_valid_sampling_parameters_are_served(client, extra):
    response = client.post(CMPL, json={"prompt": "Hello there", "max_tokens": 3, **extra})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


UNSUPPORTED = [
    (CHAT, {"response_format": {"type": "json_object"}}, "response_format"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    (CHAT, {"tool_choice": "auto"}, "tool_choice"),
    (CHAT, {"logit_bias": {"50": 10}}, "logit_bias"),
    (CHAT, {"presence_penalty": 0.5}, "presence_penalty"),
    (CHAT, {"frequency_penalty": 1}, "frequency_penalty"),
    (CHAT, {"n": 2}, "n"),
    (CHAT, {"n": True}, "n"),
    (CMPL, {"best_of": 3}, "best_of"),
    (CMPL, {"suffix": "the end"}, "suffix"),
    (CMPL, {"n": 4}, "n"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content.0.type"),
]


@pytest.mark.parametrize("path,extra,field", UNSUPPORTED, ids=[u[2] for u in UNSUPPORTED])
def test_unimplemented_openai_fields_are_refused_as_not_supported(client, path, extra, field):
    body = {"messages": MSG, **extra} if path == CHAT else {"prompt": "hi", **extra}
    response = client.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field and "not supported" in error["message"]
    assert error["code"] == "unsupported_parameter"


def test_request_token_budget_is_enforced_before_any_work(tiny_model):
    from fastapi.testclient import TestClient

    from serving.config import ServeConfig
    from serving.server import create_app

    profile = load_profile(tiny_model["path"]).model_copy(update={"max_context": 256})
    app = create_app(tiny_model["path"], profile, model_name="tiny", config=ServeConfig(max_request_tokens=100))
    with TestClient(app) as client:
        over = client.post(CMPL, json={"prompt": [[5] * 40, [6] * 40], "max_tokens": 30})
        assert over.status_code == 400 and "serve.max_request_tokens" in over.json()["error"]["message"]
        assert client.post(CMPL, json={"prompt": [[5] * 40], "max_tokens": 30}).status_code == 200


def test_error_bodies_are_openai_shaped_json(client):
    response = _post(client, CMPL, json.dumps({"prompt": "hi", "max_tokens": True}))
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["type"] == "invalid_request_error"
    assert body["request_id"] == response.headers["x-request-id"]
