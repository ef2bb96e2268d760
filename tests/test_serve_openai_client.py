"""The official `openai` client against a real uvicorn server, unchanged: completions, chat, streaming."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def base_url(tiny_model):
    from evaluation.server import create_app
    from evaluation.testing import serve_in_thread
    from mlops.profile import load_profile

    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="tiny")
    with serve_in_thread(app) as url:
        yield url + "/v1"


@pytest.fixture
def client(base_url):
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def test_openai_client_lists_models_and_completes(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    out = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0)
    assert out.choices[0].finish_reason in ("stop", "length") and out.usage.prompt_tokens > 0


def test_openai_client_chat_and_streaming_agree(client):
    messages = [{"role": "user", "content": "Where is my parcel?"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True)
    pieces, reasons = [], []
    for chunk in stream:
        delta = chunk.choices[0].delta
        pieces.append(delta.content or "")
        reasons.append(chunk.choices[0].finish_reason)
    assert "".join(pieces) == whole.choices[0].message.content
    assert reasons[-1] == whole.choices[0].finish_reason


def test_openai_client_raises_typed_errors_for_bad_requests(client):
    import openai

    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[], max_tokens=1)
    assert "messages" in str(info.value)
    assert client.completions.create(model="tiny", prompt="ok", max_tokens=1).choices
