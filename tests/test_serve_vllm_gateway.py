"""Our gateway on the `vllm` engine, on CPU: every request and response translated to and from vLLM's documented
formats (tests/fake_vllm.py, answered by the real tiny model), so what reaches clients equals the `hf` engine."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serving.engine import GenParams


@pytest.fixture(scope="module")
def backend(tiny_model):
    """A vLLM-shaped server on a free port, and the hf engine that answers it."""
    from serving.testing import serve_in_thread
    from tests.conftest import build_test_engine
    from tests.fake_vllm import fake_vllm_app

    engine = build_test_engine("hf", tiny_model)
    app = fake_vllm_app(engine)
    with serve_in_thread(app) as url:
        yield url, app, engine
    engine.close()


@pytest.fixture(scope="module")
def gateway_engine(backend, tiny_model):
    from serving.engine import EngineSpec, build_engine

    url, _app, _ = backend
    engine = build_engine(tiny_model["path"], EngineSpec("vllm", options={"url": url}))
    yield engine
    engine.close()


def test_the_vllm_engine_finds_the_served_model_and_its_tokenizer(gateway_engine, backend):
    _, _, hf = backend
    assert gateway_engine.model == "support-bot-lora"  # the only model vLLM lists (a LoRA module name here)
    assert gateway_engine.chat_template() == hf.chat_template()
    assert gateway_engine.tokenizer_info().eos_token == hf.tokenizer_info().eos_token
    assert gateway_engine.vocab_size == 49152  # from the version's own config.json
    text = "Where is my order 1234?"
    assert gateway_engine.tokenize(text) == hf.tokenize(text)
    messages = [{"role": "user", "content": text}]
    assert gateway_engine.chat_prompt(messages) == hf.chat_prompt(messages)


def test_scoring_sends_token_ids_with_echo_and_reads_prompt_logprobs(gateway_engine, backend):
    _, app, hf = backend
    prompts = [hf.tokenize("Refunds take five days."), hf.tokenize("Refunds take")]
    ours = gateway_engine.score(prompts, top_k=2).result(timeout=60)
    theirs = hf.score(prompts, top_k=2).result(timeout=60)
    request = app.state.requests[-1]
    assert request["prompt"] == prompts and request["echo"] is True and request["max_tokens"] == 1
    assert request["temperature"] == 0.0 and request["logprobs"] == 2
    for a, b in zip(ours, theirs, strict=True):
        assert a.tokens == b.tokens and a.token_logprobs == b.token_logprobs and a.top_logprobs == b.top_logprobs


def test_streamed_generation_keeps_ids_logprobs_and_the_finish_reason(gateway_engine, backend):
    _, app, hf = backend
    ids = hf.tokenize("Once upon a time")
    params = GenParams(max_tokens=6, temperature=0.0, logprobs=2, seed=5)
    deltas = []
    ours = gateway_engine.generate(ids, params, on_text=deltas.append).future.result(timeout=60)
    theirs = hf.generate(ids, params).future.result(timeout=60)
    request = app.state.requests[-1]
    assert request["stream"] is True and request["prompt"] == ids and request["seed"] == 5
    assert ours.tokens == theirs.tokens and ours.text == theirs.text and ours.finish_reason == theirs.finish_reason
    assert ours.token_logprobs == pytest.approx(theirs.token_logprobs) and len(ours.top_logprobs) == len(ours.tokens)
    assert "".join(d.text for d in deltas) == ours.text


def test_a_cancelled_generation_aborts_the_vllm_request(gateway_engine, backend):
    _, app, hf = backend
    before, started = app.state.aborted, threading.Event()
    handle = gateway_engine.generate(hf.tokenize("Tell me a story"), GenParams(max_tokens=200, temperature=1.0,
                                                                                seed=1), on_text=lambda _d: started.set())
    assert started.wait(30)
    handle.cancel()
    assert handle.future.result(timeout=30).finish_reason == "cancelled"
    deadline = time.monotonic() + 10
    while app.state.aborted == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.state.aborted == before + 1


def test_clients_of_the_gateway_get_what_the_hf_engine_gives(backend, tiny_model):
    from mlops.profile import load_profile
    from serving.engine import EngineSpec, build_engine
    from serving.server import create_app
    from serving.testing import serve_in_thread
    from tests.conftest import build_test_engine

    url, _, _ = backend
    profile = load_profile(tiny_model["path"]).model_copy(update={"max_context": 512})
    body = {"model": "tiny", "prompt": "The refund policy", "echo": True, "max_tokens": 1, "logprobs": 1,
            "temperature": 0}
    answers = []
    # each app closes its engine when it stops
    for engine in (build_engine(tiny_model["path"], EngineSpec("vllm", options={"url": url})),
                   build_test_engine("hf", tiny_model)):
        app = create_app(tiny_model["path"], profile, model_name="tiny", engine=engine)
        with serve_in_thread(app) as gateway:
            answers.append(httpx.post(f"{gateway}/v1/completions", json=body, timeout=60).json()["choices"][0])
            chat = httpx.post(f"{gateway}/v1/chat/completions", timeout=60, json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert chat.status_code == 200
    assert answers[0]["logprobs"]["token_logprobs"] == answers[1]["logprobs"]["token_logprobs"]
    assert answers[0]["text"] == answers[1]["text"]


def test_a_vllm_engine_without_a_url_says_how_to_start_one(tiny_model):
    from mlops.errors import ConfigError
    from serving.engine import EngineSpec, build_engine

    with pytest.raises(ConfigError, match="serve.vllm.url"):
        build_engine(tiny_model["path"], EngineSpec("vllm"))
