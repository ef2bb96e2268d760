"""A server following the registry routes the ledger's canary share to the canary version, labels it, counts it
per version in /metrics, and unloads it when the canary stops or runs out of time."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from serving.testing import canary_start, canary_stop


@pytest.mark.parametrize("engine", ["hf", pytest.param("llamacpp", marks=pytest.mark.slow)])  # llamacpp: CI
def test_canary_takes_its_share_labelled_and_counted_per_version_then_unloads(traced_home, tiny_model, tmp_path, engine,
                                                                              request):
    import httpx

    from mlops.model_refs import resolve_model_ref
    from mlops.requestlog import read_requests
    from mlops.tracking import init_experiment
    from registry.follow import Follower
    from registry.release import register
    from registry.testing import make_identities, release_version, training_run
    from serving.config import ServeConfig
    from serving.metrics import version_stats
    from serving.request_log import RequestLogWriter
    from serving.server import create_app
    from serving.testing import serve_in_thread

    init_experiment("registry-test")
    who = make_identities()
    v1, v2 = (register(who["tina"], training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=i), "bot")
              for i in (1, 2))
    release_version(who, "bot", v1)
    main = resolve_model_ref(f"models:/bot/{v1}")
    writer = RequestLogWriter(flush_seconds=0.05)
    if engine == "llamacpp":
        request.getfixturevalue("tiny_gguf")  # llama.cpp is built (or the test says why not)
    config = ServeConfig(engine=engine, llamacpp={"quantization": "f16", "parallel": 2, "context_per_slot": 512})
    app = create_app(main.hf_dir, main.profile(), model_name="bot@production", version=v1, request_log=writer,
                     log_model="bot", config=config)
    follower = Follower("bot", "production", None).attach(app.state.slot, canary=app.state.canary)
    ids = [f"req-{i}" for i in range(16)]
    body = {"messages": [{"role": "user", "content": "Where is my order?"}], "max_tokens": 2}

    def versions(client) -> dict:
        return {rid: client.post("/v1/chat/completions", json=body, headers={"X-Request-ID": f"{rid}-{tag}"})
                .headers["x-model-version"] for rid in ids}

    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert follower.poll_once() is None and not app.state.canary.active()
        canary_start("bot", v2, 0.5, time.time() + 600)
        follower.poll_once()
        assert follower.canary_events == [f"started {v2}"] and app.state.canary.active()
        tag = "canary"
        app.state.canary.draw, draws = random.Random(29).random, random.Random(29)  # the server's draw, seeded
        routed = versions(client)
        expected = {rid: v2 if draws.random() < 0.5 else v1 for rid in ids}
        assert routed == expected and 3 <= list(routed.values()).count(v2) <= 13
        assert client.get("/v1/models").json()["data"][0]["version"] == v1  # only generation is routed
        stats = version_stats(client.get("/metrics").text)
        assert stats[v2]["by_role"] == {"canary": list(routed.values()).count(v2)}
        assert stats[v1]["by_role"] == {"user": list(routed.values()).count(v1)} and stats[v2]["errors"] == 0
        assert stats[v2]["p95_seconds"] > 0
        assert f'mlops_serve_canary_share{{version="{v2}"}} 0.5' in client.get("/metrics").text
        canary_engine = app.state.canary.slot.current

        canary_stop("bot", v2)
        follower.poll_once()
        tag = "after-stop"
        assert set(versions(client).values()) == {v1}
        assert app.state.canary.slot.current is None and follower.canary_events[-1] == f"stopped {v2}"
        deadline = time.monotonic() + 30
        while not canary_engine.closed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert canary_engine.closed  # unloaded once its requests finished

        now = [time.time()]
        app.state.canary.clock = follower.clock = lambda: now[0]
        canary_start("bot", v2, 1.0, now[0] + 600)  # again, all traffic, and nobody stops it in time
        follower.poll_once()
        tag = "short"
        assert set(versions(client).values()) == {v2}
        now[0] += 601
        tag = "expired"
        assert set(versions(client).values()) == {v1}  # routing ends at `until`, before the follower looks
        follower.poll_once()
        assert app.state.canary.slot.current is None
        assert writer.flush(30)
    rows = read_requests(model="bot")
    canary_rows = [r for r in rows if r["role"] == "canary"]
    assert {r["request_id"] for r in canary_rows} == \
        {f"{rid}-canary" for rid, v in routed.items() if v == v2} | {f"{rid}-short" for rid in ids}
    assert {r["version"] for r in canary_rows} == {v2}
    assert all(r["version"] == v1 for r in rows if r["role"] == "user")


def test_the_canary_split_follows_the_share_whatever_request_id_the_client_sends(tiny_model):
    """The client's X-Request-ID used to decide the route: an id the old hash sent to the canary (or away from it)
    must now get the share, like any other."""
    import hashlib

    from fastapi.testclient import TestClient

    from mlops.profile import load_profile
    from serving.config import ServeConfig
    from serving.server import create_app

    def old_route(rid: str) -> bool:
        return int.from_bytes(hashlib.blake2b(f"canary:{rid}".encode(), digest_size=8).digest(), "big") / 2**64 < 0.3

    profile = load_profile(tiny_model["path"])
    app = create_app(tiny_model["path"], profile, model_name="tiny", version="1", config=ServeConfig())
    app.state.canary.slot.load_and_swap(tiny_model["path"], profile, "2")
    app.state.canary.set("2", 0.3, None)
    chosen = next(f"pick-{i}" for i in range(1000) if old_route(f"pick-{i}"))
    avoided = next(f"dodge-{i}" for i in range(1000) if not old_route(f"dodge-{i}"))
    body = {"prompt": "hi", "max_tokens": 1}
    with TestClient(app) as client:
        for rid in (chosen, avoided):
            answered = [client.post("/v1/completions", json=body, headers={"X-Request-ID": rid}) for _ in range(200)]
            assert all(a.status_code == 200 and a.headers["x-request-id"] == rid for a in answered)
            to_canary = sum(a.headers["x-model-version"] == "2" for a in answered)
            assert 30 <= to_canary <= 90, (rid, to_canary)  # 60 expected; > 4.5 standard deviations either way


def test_a_canary_that_fails_to_load_leaves_all_traffic_on_the_serving_version(mlops_home, tiny_model, tmp_path,
                                                                               caplog):
    from mlops.model_refs import resolve_model_ref
    from mlops.tracking import init_experiment
    from registry.follow import Follower
    from registry.release import register
    from registry.testing import make_identities, release_version, training_run
    from serving.server import create_app

    init_experiment("registry-test")
    who = make_identities()
    v1, v2 = (register(who["tina"], training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=i), "bot")
              for i in (1, 2))
    release_version(who, "bot", v1)
    main = resolve_model_ref(f"models:/bot/{v1}")
    app = create_app(main.hf_dir, main.profile(), model_name="bot@production", version=v1)

    def broken(ref: str):
        raise OSError(f"artifacts of {ref} are gone")

    follower = Follower("bot", "production", None, materialize=broken).attach(app.state.slot,
                                                                               canary=app.state.canary)
    canary_start("bot", v2, 0.5, time.time() + 600)
    assert follower.poll_once() is None
    assert follower.canary_events == [f"failed {v2}"] and not app.state.canary.active()
    assert app.state.slot.current.version == v1 and "the canary could not be started" in caplog.text
    follower.poll_once()  # not retried at every poll
    assert follower.canary_events == [f"failed {v2}"]


def test_version_stats_gives_a_windows_requests_error_rate_and_p95_per_version():
    from serving.metrics import ServerMetrics, version_stats

    metrics = ServerMetrics()

    def answer(version, role, status, seconds, failed=False):
        metrics.observe({"route": "/v1/chat/completions", "method": "POST", "status": status, "model_version": version,
                         "role": role, "latency_ms": seconds * 1000, "failed": failed})

    for _ in range(50):
        answer("1", "user", 200, 0.03)
    before = metrics.render()[0].decode()
    for i in range(100):
        answer("1", "user", 200, 0.2)
        answer("2", "canary", 500 if i < 5 else 200, 0.2 if i < 90 else 4.0, failed=False)
    answer("2", "canary", 200, 0.2, failed=True)  # a stream that broke after its 200
    answer("2", "canary", 400, 0.01)  # the client's mistake: no error of the version
    metrics.observe({"route": "/v1/models", "method": "GET", "status": 500, "model_version": "2", "latency_ms": 1})
    stats = version_stats(metrics.render()[0].decode(), before)
    assert stats["1"]["requests"] == 100 and stats["1"]["errors"] == 0 and stats["1"]["by_role"] == {"user": 100}
    assert 0.1 < stats["1"]["p95_seconds"] <= 0.25  # the window's, not the fast answers before it
    assert stats["2"]["requests"] == 102 and stats["2"]["errors"] == 6
    assert abs(stats["2"]["error_rate"] - 6 / 102) < 1e-9
    assert 2.5 < stats["2"]["p95_seconds"] <= 5.0  # the slow tenth shows in the p95
    assert version_stats(metrics.render()[0].decode())["1"]["requests"] == 150  # without a window: since start
