"""The canary controller on a real ledger: rollback on injected errors or latency, promotion through the registry,
and reading error rate and p95 per version from Prometheus /metrics text."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mlops.identities import AuthError
from registry.canary import Limits, VersionStats, judge, parse_metrics, watch
from registry.transition import RefusedError

ROUTE = "/v1/chat/completions"


class FakeServers:
    """What /metrics of the serving replicas would say: real prometheus_client metrics labelled by version, moved
    forward one tick per read by `script(tick, serve)`."""

    def __init__(self, script):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("mlops_serve_requests", "requests", ["route", "method", "status", "version"],
                                registry=self.registry)
        self.latency = Histogram("mlops_serve_request_latency_seconds", "latency", ["route", "version"],
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5), registry=self.registry)
        self.script, self.tick = script, 0

    def serve(self, version: str, n: int, *, seconds: float = 0.08, errors: int = 0) -> None:
        for i in range(n):
            self.requests.labels(ROUTE, "POST", "500" if i < errors else "200", version).inc()
            self.latency.labels(ROUTE, version).observe(seconds)

    def read(self) -> dict[str, VersionStats]:
        from prometheus_client import generate_latest

        self.script(self.tick, self.serve)
        self.tick += 1
        return parse_metrics(generate_latest(self.registry).decode())


class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


LIMITS = Limits(share=0.1, seconds=60, max_error_rate=0.05, max_p95_ratio=1.5, min_requests=10, interval=5)


@pytest.fixture
def reg(mlops_home, tiny_model, tmp_path):
    """v1 in production; v2 a candidate with gate evidence, requested by tina and approved by alice."""
    from registry.testing import challenger_requested

    return challenger_requested(Path(tiny_model["path"]), tmp=tmp_path, comment="canary it first")


def run_canary(who, script, limits=LIMITS):
    """The canary of v2 (thresholds: the recorded policy's defaults, 2% errors, p95 1.5x, 20 requests)."""
    clock = Clock()
    servers = FakeServers(script)
    return watch(who["bob"], "bot", "2", limits, servers.read, clock=clock, sleep=clock.sleep)


def entries():
    from registry import ledger

    return ledger.entries("bot")


def healthy(tick, serve):
    serve("1", 90, seconds=0.08)
    serve("2", 10, seconds=0.09)


def test_canary_rolls_back_by_itself_when_errors_or_latency_cross_a_threshold(reg):
    from registry.audit import model_state
    from registry.transition import flush_display
    from registry.versions import version_tags

    decide_ok(reg)
    for trouble, expected in (({"errors": 3}, "canary error rate"), ({"seconds": 0.9}, "canary p95 latency")):
        def script(tick, serve, trouble=trouble):
            serve("1", 90, seconds=0.08)
            serve("2", 10, **(trouble if tick == 3 else {"seconds": 0.09}))

        result = run_canary(reg, script)
        assert result["outcome"] == "rolled_back" and expected in result["reason"]
        start, stop = [e for e in entries() if e.action.startswith("canary")][-2:]
        assert start.evidence["share"] == 0.1 and start.evidence["champion"] == "1" and start.actor == "bob"
        assert stop.evidence["outcome"] == "rolled_back" and stop.evidence["canary_seq"] == start.seq
        assert stop.evidence["automatic"] and stop.evidence["observed"]["canary_requests"] == 30
        state = model_state("bot")
        assert state.canary is None and state.aliases["production"] == "1" and state.stage_of("2") == "candidate"
        flush_display()
        assert version_tags("bot", "2")["registry.canary"].startswith(f"rolled_back: {expected}")


def test_canary_that_stays_healthy_is_promoted_through_the_registry_at_the_end(reg):
    from registry.audit import model_state

    decide_ok(reg)
    result = run_canary(reg, healthy)
    assert result["outcome"] == "promoted", result["reason"]
    assert [e.action for e in entries()][-3:] == ["canary_start", "promote", "canary_stop"]
    promoted = entries()[-2]
    assert promoted.evidence["approved_by"] == "alice" and promoted.alias_before == "1"
    state = model_state("bot")
    assert state.aliases["production"] == "2" and state.canary is None
    assert result["observed"]["canary_requests"] == 10 * 12 and result["observed"]["p95_ratio"] < 1.5


def decide_ok(who) -> None:
    from registry.release import decide

    decide(who["alice"], "bot", "2", "approved, pending the canary", approve=True)


def test_canary_with_too_little_traffic_stops_and_says_why_and_without_the_approval_never_starts(reg):
    from registry import ledger
    from registry.audit import model_state

    before = len(ledger.entries())
    with pytest.raises(RefusedError, match="no approved request to production"):
        run_canary(reg, healthy)
    assert len(ledger.entries()) == before
    decide_ok(reg)
    result = run_canary(reg, lambda tick, serve: serve("1", 50) if tick else None)
    assert result["outcome"] == "stopped" and "fewer than the 20 needed" in result["reason"]
    assert entries()[-1].evidence["outcome"] == "stopped"
    assert model_state("bot").aliases["production"] == "1"


def test_canary_start_needs_the_promote_permission_and_one_canary_at_a_time_and_stops_despite_drift(reg):
    from registry.canary import start, stop

    with pytest.raises(AuthError):
        start(reg["tina"], "bot", "2", LIMITS)
    with pytest.raises(RefusedError, match="version 1 of 'bot' is production; a canary runs a staging or candidate"):
        start(reg["bob"], "bot", "1", LIMITS)
    decide_ok(reg)
    start(reg["bob"], "bot", "2", LIMITS)
    with pytest.raises(RefusedError, match=r"a canary of 'bot' already runs \(v2, started by bob"):
        start(reg["alice"], "bot", "2", LIMITS)
    from mlops.tracking import client
    from registry.transition import flush_display

    flush_display()  # the acts' own copies land first
    client().set_registered_model_alias("bot", "staging", "2")  # drift: moved by hand in the MLflow UI
    from registry.audit import verify

    assert any("@staging points to 2 in MLflow" in p for p in verify("bot").drift["bot"])
    stop(reg["alice"], "bot", "stopped", "traffic spike, try tomorrow")  # a stop never waits for a repair
    assert entries()[-1].evidence == {"outcome": "stopped", "reason": "traffic spike, try tomorrow",
                                      "canary_seq": entries()[-2].seq}


def test_judge_counts_early_errors_and_waits_for_enough_requests():
    limits = Limits(share=0.1, seconds=60, max_error_rate=0.05, min_requests=20)
    few = {"2": VersionStats(requests=5, errors=1), "1": VersionStats(requests=100)}
    assert judge(few, "2", "1", limits)[0] is None  # 1 error in 5 could still end at 1 in 20
    burst = {"2": VersionStats(requests=5, errors=2), "1": VersionStats(requests=100)}
    assert "error rate" in judge(burst, "2", "1", limits)[0]  # 2 errors exceed 5% of 20 whatever follows


METRICS_FIXTURE = """\
# HELP mlops_serve_requests_total HTTP requests by route and status
# TYPE mlops_serve_requests_total counter
mlops_serve_requests_total{method="POST",route="/v1/chat/completions",status="200",version="1"} 95.0
mlops_serve_requests_total{method="POST",route="/v1/chat/completions",status="500",version="1"} 5.0
mlops_serve_requests_total{method="POST",route="/v1/chat/completions",status="200",version="2"} 10.0
mlops_serve_requests_total{method="GET",route="/metrics",status="200",version="1"} 40.0
# HELP mlops_serve_request_latency_seconds request latency
# TYPE mlops_serve_request_latency_seconds histogram
mlops_serve_request_latency_seconds_bucket{le="0.1",route="/v1/chat/completions",version="1"} 50.0
mlops_serve_request_latency_seconds_bucket{le="0.5",route="/v1/chat/completions",version="1"} 90.0
mlops_serve_request_latency_seconds_bucket{le="1.0",route="/v1/chat/completions",version="1"} 100.0
mlops_serve_request_latency_seconds_bucket{le="+Inf",route="/v1/chat/completions",version="1"} 100.0
mlops_serve_request_latency_seconds_count{route="/v1/chat/completions",version="1"} 100.0
mlops_serve_request_latency_seconds_sum{route="/v1/chat/completions",version="1"} 20.0
mlops_serve_request_latency_seconds_bucket{le="0.1",route="/v1/chat/completions",version="2"} 0.0
mlops_serve_request_latency_seconds_bucket{le="0.5",route="/v1/chat/completions",version="2"} 0.0
mlops_serve_request_latency_seconds_bucket{le="1.0",route="/v1/chat/completions",version="2"} 4.0
mlops_serve_request_latency_seconds_bucket{le="+Inf",route="/v1/chat/completions",version="2"} 10.0
"""


def test_parse_metrics_reads_requests_errors_and_p95_per_version_from_model_routes():
    stats = parse_metrics(METRICS_FIXTURE)
    assert set(stats) == {"1", "2"}
    assert (stats["1"].requests, stats["1"].errors, stats["1"].error_rate) == (100, 5, 0.05)  # /metrics not counted
    assert stats["1"].quantile(0.95) == pytest.approx(0.5 + 0.5 * (95 - 90) / 10)
    assert stats["2"].quantile(0.95) == 1.0  # past the largest finite bucket: its bound


def test_parse_metrics_reads_a_real_servers_metrics(tiny_model):
    from fastapi.testclient import TestClient

    from mlops.profile import load_profile
    from serving.server import create_app

    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="bot", version="7")
    with TestClient(app) as client:
        for _ in range(3):
            body = {"messages": [{"role": "user", "content": "Where is my order?"}], "max_tokens": 2}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        client.post("/v1/chat/completions", json={"messages": []})  # a 400: the client's fault, not an error
        text = client.get("/metrics").text
    stats = parse_metrics(text)
    assert set(stats) == {"7"}
    assert stats["7"].requests == 4 and stats["7"].errors == 0
    assert 0 < stats["7"].quantile(0.95) < 60


def test_per_version_metrics_split_a_canary_from_the_champion_on_one_server():
    from registry.canary import parse_metrics

    text = """# TYPE mlops_serve_version_requests counter
mlops_serve_version_requests_total{version="1",role="user",status="200"} 90.0
mlops_serve_version_requests_total{version="2",role="canary",status="200"} 8.0
mlops_serve_version_requests_total{version="2",role="canary",status="500"} 2.0
# TYPE mlops_serve_version_errors counter
mlops_serve_version_errors_total{version="2",role="canary"} 2.0
# TYPE mlops_serve_version_request_latency_seconds histogram
mlops_serve_version_request_latency_seconds_bucket{version="2",role="canary",le="0.5"} 9.0
mlops_serve_version_request_latency_seconds_bucket{version="2",role="canary",le="+Inf"} 10.0
mlops_serve_version_request_latency_seconds_count{version="2",role="canary"} 10.0
mlops_serve_version_request_latency_seconds_sum{version="2",role="canary"} 3.0
"""
    stats = parse_metrics(text)
    assert stats["1"].requests == 90 and stats["1"].errors == 0
    assert stats["2"].requests == 10 and stats["2"].errors == 2 and stats["2"].buckets[0.5] == 9
