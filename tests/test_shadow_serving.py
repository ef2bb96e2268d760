"""`mlops serve --shadow`: a share of requests is answered again by a candidate in the background, logged with the
user's request id, never changing or delaying the user's answer."""

from __future__ import annotations

import json
import threading
import time

import pytest


@pytest.fixture(scope="module")
def profile(tiny_model):
    from mlops.profile import load_profile

    return load_profile(tiny_model["path"])


@pytest.fixture(scope="module")
def engines(engine_name, tiny_model, request):
    """Makes a fresh engine of `engine_name` (each app closes its own): every test here runs on hf and llamacpp."""
    from tests.conftest import build_test_engine

    gguf = request.getfixturevalue("tiny_gguf") if engine_name == "llamacpp" else None
    return lambda: build_test_engine(engine_name, tiny_model, gguf)


def _runner(engines, profile, **options):
    from serving.shadow import ShadowRunner
    from serving.slot import ModelSlot

    slot = ModelSlot("bot#shadow")
    slot.swap(engines(), profile, "2", model_dir=None)
    return ShadowRunner(slot, **{"share": 1.0, **options})


def _app(engines, tiny_model, profile, shadow=None):
    from serving.request_log import RequestLogWriter
    from serving.server import create_app

    writer = RequestLogWriter(flush_seconds=0.05)
    return create_app(tiny_model["path"], profile, model_name="bot", version="1", request_log=writer,
                      shadow=shadow, log_model="bot", engine=engines()), writer


CHAT = {"messages": [{"role": "user", "content": "Where is my order 1234?"}], "max_tokens": 8, "temperature": 0}
COMPLETION = {"prompt": "Refunds take", "max_tokens": 6, "temperature": 0, "stream": True}


def _ask(client) -> list:
    chat = client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "chat-1"})
    with client.stream("POST", "/v1/completions", json=COMPLETION, headers={"X-Request-ID": "stream-1"}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    return [(chat.status_code, chat.headers["x-model-version"], chat.json()["choices"][0]["message"]["content"]),
            (s.status_code, s.headers["x-model-version"], [(e["choices"][0]["text"], e["choices"][0]["finish_reason"])
                                                           for e in events])]


def test_shadow_answers_are_logged_beside_the_users_and_the_users_answer_is_unchanged(engines, traced_home, tiny_model,
                                                                                       profile):
    import httpx

    from mlops.requestlog import read_requests
    from serving.testing import serve_in_thread

    plain, _ = _app(engines, tiny_model, profile)
    with serve_in_thread(plain) as url, httpx.Client(base_url=url, timeout=60) as client:
        alone = _ask(client)
    runner = _runner(engines, profile)
    shadowed, writer = _app(engines, tiny_model, profile, shadow=runner)
    answered = 'mlops_serve_shadow_requests_total{outcome="answered",version="2"} 2.0'
    with serve_in_thread(shadowed) as url, httpx.Client(base_url=url, timeout=60) as client:
        with_shadow = _ask(client)
        # The second offer is made after its response was sent: wait for both shadow answers, not for a moment.
        metrics = _wait_for(lambda: client.get("/metrics").text, lambda text: answered in text, 60)
        assert runner.wait_idle(60) and writer.flush(30)
    assert [a[:2] for a in with_shadow] == [(200, "1"), (200, "1")]
    assert [a[2] for a in with_shadow] == [a[2] for a in alone]  # same bytes as without a shadow
    rows = {r["request_id"]: r for r in read_requests(model="bot") if r["request_id"] in ("chat-1", "stream-1",
                                                                                          "chat-1:shadow",
                                                                                          "stream-1:shadow")}
    assert len(rows) == 4
    for rid in ("chat-1", "stream-1"):
        user, shadow = rows[rid], rows[f"{rid}:shadow"]
        assert (user["role"], user["version"]) == ("user", "1")
        assert (shadow["role"], shadow["version"], shadow["parent_id"], shadow["status"]) == ("shadow", "2", rid, 200)
        assert shadow["messages"] == user["messages"] and shadow["route"] == user["route"]
        assert shadow["response"] == user["response"]  # the same weights answer the same, in the background
        assert shadow["tokens_in"] == user["tokens_in"] and shadow["tokens_out"] == user["tokens_out"]
        assert shadow["latency_ms"] > 0
    assert answered in metrics


def _wait_for(read, done, timeout: float):
    """`read()` until `done(value)` or the timeout; returns the last value read."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value


def test_the_shadow_engine_makes_no_progress_while_the_user_engine_has_work(engines):
    from serving.engine import GenParams

    engine, user_busy = engines(), threading.Event()
    engine.yield_to = user_busy.is_set
    try:
        user_busy.set()
        job = engine.generate([1, 2, 3], GenParams(max_tokens=4))
        time.sleep(0.5)
        assert not job.future.done() and job.first_token_at is None  # stood aside the whole time
        user_busy.clear()
        assert len(job.future.result(timeout=60).tokens) == 4
        assert engine.yielded() >= 0.4
    finally:
        engine.close()


def test_a_starved_shadow_drops_offers_counted_and_unlogged_while_users_are_served(engines, traced_home, tiny_model,
                                                                                    profile):
    import httpx

    from mlops.requestlog import read_requests
    from serving.testing import serve_in_thread

    runner = _runner(engines, profile, queue_size=1, timeout=0.5)
    app, writer = _app(engines, tiny_model, profile, shadow=runner)
    runner.slot.current.engine.yield_to = lambda: True  # as if user traffic never stopped: no turn for the shadow
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        answers = [client.post("/v1/completions", json={"prompt": f"Question {i}", "max_tokens": 2},
                               headers={"X-Request-ID": f"q{i}"}) for i in range(6)]
        assert runner.wait_idle(60) and writer.flush(30)
        metrics = client.get("/metrics").text
    assert all(a.status_code == 200 and a.headers["x-model-version"] == "1" for a in answers)
    assert runner.counts == {"dropped_busy": 6}  # queue full, or starved past its timeout: never evidence
    assert read_requests(role="shadow") == [] and len(read_requests(role="user")) == 6
    assert 'mlops_serve_shadow_requests_total{outcome="dropped_busy",version="2"} 6.0' in metrics


def test_a_candidate_slower_than_the_timeout_is_logged_as_its_own_failure(engines, traced_home, tiny_model, profile):
    import concurrent.futures

    import httpx

    from mlops.requestlog import read_requests
    from serving.testing import serve_in_thread

    class Hung:  # a candidate that never finishes its answer
        def __init__(self) -> None:
            self.future, self.cancelled, self.first_token_at = concurrent.futures.Future(), threading.Event(), None

    runner = _runner(engines, profile, timeout=0.3)
    app, writer = _app(engines, tiny_model, profile, shadow=runner)
    runner.slot.current.engine.generate = lambda *_a, **_k: Hung()
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        answer = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                             headers={"X-Request-ID": "slow-1"})
        assert runner.wait_idle(60) and writer.flush(30)
    assert answer.status_code == 200 and runner.counts == {"timed_out": 1}
    (row,) = read_requests(role="shadow")
    assert (row["parent_id"], row["status"]) == ("slow-1", 504) and "longer than 0.3 s" in row["error"]


def test_the_shadowed_share_is_the_sampled_request_ids(engines, traced_home, tiny_model, profile):
    import httpx

    from mlops.requestlog import read_requests
    from serving.canary import sampled
    from serving.testing import serve_in_thread

    runner = _runner(engines, profile, share=0.3, queue_size=64)
    app, writer = _app(engines, tiny_model, profile, shadow=runner)
    ids = [f"share-{i}" for i in range(30)]
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        for rid in ids:
            assert client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                               headers={"X-Request-ID": rid}).status_code == 200
        assert runner.wait_idle(60) and writer.flush(30)
    shadowed = sorted(r["parent_id"] for r in read_requests(role="shadow"))
    expected = sorted(rid for rid in ids if sampled(rid, 0.3, runner.salt))
    assert shadowed == expected and 3 <= len(expected) <= 18
    from serving.shadow import ShadowRunner
    from serving.slot import ModelSlot

    other = ShadowRunner(ModelSlot("bot#other"), share=0.3)  # another server's secret salt picks another subset
    assert other.salt != runner.salt and [sampled(r, 0.3, other.salt) for r in ids] != [sampled(r, 0.3, runner.salt)
                                                                                          for r in ids]


def test_serve_refuses_a_shadow_without_a_share_or_without_a_request_log(mlops_home, tiny_model):
    import os
    import subprocess
    import sys

    base = [sys.executable, "-m", "mlops", "serve", "--model", tiny_model["path"], "--no-auth",
            "--shadow", tiny_model["path"]]
    env = {**os.environ, "MLOPS_HOME": str(mlops_home)}
    no_share = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300)
    no_log = subprocess.run([*base, "--shadow-share", "0.2", "serve.request_log.enabled=false"], capture_output=True,
                            text=True, env=env, timeout=300)
    assert no_share.returncode != 0 and "--shadow-share 0.2" in no_share.stderr, no_share.stderr[-2000:]
    assert no_log.returncode != 0 and "serve.request_log.enabled" in no_log.stderr, no_log.stderr[-2000:]
    assert "Traceback" not in no_share.stderr + no_log.stderr


def test_a_shadow_with_no_candidate_yet_shadows_nothing_until_one_is_swapped_in(engines, traced_home, tiny_model, profile):
    import httpx

    from mlops.requestlog import read_requests
    from serving.shadow import ShadowRunner
    from serving.slot import ModelSlot
    from serving.testing import serve_in_thread

    runner = ShadowRunner(ModelSlot("bot#shadow"), share=1.0)  # `serve --follow --shadow @candidate`, none yet
    app, writer = _app(engines, tiny_model, profile, shadow=runner)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        before = client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "early"})
        runner.slot.load_and_swap(tiny_model["path"], profile, "2")  # what the follower does on registration
        after = client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "late"})
        assert runner.wait_idle(60) and writer.flush(30)
    assert before.status_code == after.status_code == 200
    shadows = {r["parent_id"]: r["version"] for r in read_requests(model="bot", role="shadow")}
    assert shadows == {"late": "2"}


def test_serve_follow_starts_with_an_empty_shadow_when_no_candidate_holds_the_alias(mlops_home, monkeypatch):
    from registry import follow
    from serving import cli
    from serving.config import ServeConfig

    monkeypatch.setattr(follow.Follower, "target", lambda self, state=None: None)
    cfg = ServeConfig().model_copy(update={"shadow": ServeConfig().shadow.model_copy(update={"share": 0.5})})
    target, follower = cli._shadow("models:/bot@candidate", cfg, True, 1.0)
    assert (target.model_dir, target.version, follower.alias) == (None, None, "candidate")
    with pytest.raises(Exception, match="no version of 'bot' holds @candidate"):
        cli._shadow("models:/bot@candidate", cfg, False, 1.0)
