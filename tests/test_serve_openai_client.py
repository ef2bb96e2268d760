"""The official `openai` client against a real uvicorn server, unchanged: completions, chat, streaming; on every
engine (`hf` and `llamacpp`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def base_url(tiny_model, any_engine):
    from mlops.profile import load_profile
    from serving.server import create_app
    from serving.testing import serve_in_thread

    profile = load_profile(tiny_model["path"]).model_copy(update={"max_context": 512})
    app = create_app(tiny_model["path"], profile, model_name="tiny", engine=any_engine)
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


def test_openai_client_retrieves_the_model_and_gets_usage_only_when_asked(client):
    assert client.models.retrieve("tiny").id == "tiny"
    messages = [{"role": "user", "content": "Hi"}]
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, stream=True))
    assert all(c.usage is None and c.choices for c in plain)


def test_openai_client_streams_chat_logprobs(client):
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                            temperature=0, stream=True, logprobs=True, top_logprobs=2)
    entries = [e for chunk in stream if chunk.choices and chunk.choices[0].logprobs
               for e in chunk.choices[0].logprobs.content]
    assert entries and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)


def test_openai_client_sees_unsupported_fields_as_bad_requests(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                       response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.completions.create(model="tiny", prompt="x", max_tokens=1, n=2)
