"""Quality over time: `mlops monitor` flags a planted quality drop and stays quiet on noise (seeded synthetic
traffic), judges a version against its first week and the previous champion, and says so when a window is empty."""

from __future__ import annotations

import json
import random
import time
from dataclasses import fields

import pytest

DAY = 86400.0
NOW = 1_800_000_000.0 - 1_800_000_000.0 % DAY  # midnight UTC: 14 days are 14 calendar days
QUESTIONS = ["How do I reset my password?", "Where is my refund for order 1234?", "Can I change my plan?",
             "Why was I charged twice this month?", "How do I export my invoices?", "The app crashes on login."]
GOOD = "You can do that from Settings > Account; the change applies at once."
REFUSAL = "I'm sorry, but I can't help with that request."


def traffic(rng: random.Random, *, version: str, start: float, days: int, per_day: int, thumbs_down: float = 0.05,
            refusal: float = 0.02, latency: float = 200.0, prefix: str = "r", drop_from: float | None = None,
            drop: dict | None = None) -> tuple[list[dict], list[dict]]:
    """Served rows and their feedback: each answer thumbed down / refused with the given chances (`drop`'s
    chances from `drop_from` on)."""
    rows, feedback = [], []
    for day in range(days):
        for n in range(per_day):
            ts = start + day * DAY + (n + rng.random()) * DAY / per_day
            chances = {"thumbs_down": thumbs_down, "refusal": refusal, "latency": latency}
            if drop_from is not None and ts >= drop_from:
                chances.update(drop or {})
            rid = f"{prefix}-{version}-{day}-{n}"
            rows.append({"request_id": rid, "model": "support-bot", "version": version, "route": "/v1/chat/completions",
                         "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}],
                         "response": REFUSAL if rng.random() < chances["refusal"] else GOOD, "status": 200,
                         "role": "user", "parent_id": None, "latency_ms": rng.lognormvariate(0, 0.3) * chances["latency"],
                         "ttft_ms": None, "tokens_in": 10, "tokens_out": 20, "error": None, "ts": ts,
                         "key": f"key-{rng.randrange(400)}"})
            if rng.random() < chances["thumbs_down"]:
                feedback.append({"request_id": rid, "rating": -1, "correction": None, "source": "app", "ts": ts + 5})
    return rows, feedback


def judge(rows, feedback, *, periods=(), policy=None, days=14):
    from evaluation.monitor import answers_of, report
    from registry.config import MonitorPolicy

    policy = policy or MonitorPolicy()
    answers = answers_of(rows, feedback, window_seconds=policy.repeat_window_seconds,
                         similarity=policy.repeat_similarity)
    return report("support-bot", answers, policy=policy, periods=list(periods), now=NOW, days=days)


def test_refusal_patterns_match_refusals_not_helpful_answers():
    from evaluation.monitor import is_refusal

    for text in (REFUSAL, "I am unable to share account details.", "Sorry, I can’t do that.", "As an AI, I ..."):
        assert is_refusal(text), text
    for text in (GOOD, "I can help: open Settings.", "Refunds take 5 days; sorry for the wait.", "", None,
                 "x" * 300 + " I'm sorry, but no"):  # a refusal opens the answer, it is not buried in it
        assert not is_refusal(text), text


def test_a_keys_near_duplicate_question_within_the_window_counts_as_a_repeat():
    from evaluation.monitor import answers_of

    def row(rid, key, text, ts):
        return {"request_id": rid, "version": "1", "ts": ts, "key": key, "role": "user", "status": 200,
                "messages": [{"role": "user", "content": text}], "response": GOOD, "latency_ms": 100.0}

    rows = [row("a", "k1", "How do I reset my password?", 0), row("b", "k1", "how do i reset my password??", 60),
            row("c", "k1", "Why was I charged twice?", 100), row("d", "k1", "Why was I charged twice?", 5000),
            row("e", "k2", "Where is my refund for order 1234?", 10),
            row("f", "k3", "Where is my refund for order 1234?", 20), row("g", None, "Can I change my plan?", 30),
            row("h", None, "Can I change my plan?", 31)]
    repeats = {a.request_id: a.repeat for a in answers_of(rows, [], window_seconds=600, similarity=0.6)}
    # a's answer did not settle it (asked again 60 s later); d came after the window; other keys are other people;
    # answers without a key are not judged
    assert repeats == {"a": True, "b": False, "c": False, "d": False, "e": False, "f": False, "g": None, "h": None}


def test_intervals_hold_their_estimate_and_narrow_with_more_traffic():
    from evaluation.monitor import quantile_interval, wilson

    small, large = wilson(5, 50, 0.95), wilson(100, 1000, 0.95)
    assert small[0] < 0.1 < small[1] and large[0] < 0.1 < large[1]
    assert large[1] - large[0] < small[1] - small[0]
    assert wilson(0, 20, 0.95)[0] == 0.0 and wilson(0, 0, 0.95) == (0.0, 1.0)
    values = [float(v) for v in range(1, 1001)]
    p95, low, high = quantile_interval(values, 0.95, 0.95)
    assert low < p95 < high and 930 <= low and high <= 970 and p95 == 950.0


@pytest.mark.parametrize("seed", range(3))
def test_monitor_flags_a_planted_thumbs_down_and_refusal_rise(seed):
    rng = random.Random(seed)
    rows, feedback = traffic(rng, version="1", start=NOW - 14 * DAY, days=14, per_day=60, drop_from=NOW - 3 * DAY,
                             drop={"thumbs_down": 0.25, "refusal": 0.15})
    result = judge(rows, feedback)
    flagged = {(a["version"], a["signal"], a["reference"]) for a in result["alerts"]}
    assert flagged == {("1", "thumbs_down", "first_week"), ("1", "refusal", "first_week")}
    alert = next(a for a in result["alerts"] if a["signal"] == "thumbs_down")
    assert alert["recent_interval"][0] > alert["reference_interval"][1]
    assert alert["field"] == "registry.monitor.max_thumbs_down_increase"
    assert len(result["versions"]["1"]["days"]) == 14


@pytest.mark.parametrize("seed", range(6))
def test_monitor_stays_quiet_on_noise(seed):
    rng = random.Random(1000 + seed)
    rows, feedback = traffic(rng, version="1", start=NOW - 14 * DAY, days=14, per_day=60)
    assert judge(rows, feedback)["alerts"] == []


def test_a_small_rise_within_the_tolerance_raises_nothing():
    from registry.config import MonitorPolicy

    rng = random.Random(7)
    rows, feedback = traffic(rng, version="1", start=NOW - 14 * DAY, days=14, per_day=250,
                             drop_from=NOW - 3 * DAY, drop={"thumbs_down": 0.09})
    assert judge(rows, feedback)["alerts"] == []  # beyond the interval, but +4 points < the 5-point tolerance
    tight = judge(rows, feedback, policy=MonitorPolicy(max_thumbs_down_increase=0.01))
    assert [a["signal"] for a in tight["alerts"]] == ["thumbs_down"]


def _promotion(seq, version, before, ts):
    from registry.entries import Entry

    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
    return Entry(seq, iso, "grace", "promote", "support-bot", version, "staging", "production", "production", before,
                 version)


def test_a_new_champion_is_judged_against_the_previous_one_before_its_own_first_week_is_over():
    from evaluation.monitor import champion_periods

    rng = random.Random(3)
    old_rows, old_fb = traffic(rng, version="1", start=NOW - 20 * DAY, days=18, per_day=40, prefix="old")
    new_rows, new_fb = traffic(rng, version="2", start=NOW - 2 * DAY, days=2, per_day=60, latency=600.0,
                               prefix="new")
    periods = champion_periods([_promotion(1, "1", None, NOW - 20 * DAY), _promotion(2, "2", "1", NOW - 2 * DAY)])
    assert periods == [("1", NOW - 20 * DAY, NOW - 2 * DAY), ("2", NOW - 2 * DAY, None)]
    result = judge(old_rows + new_rows, old_fb + new_fb, periods=periods)
    v2 = [a for a in result["alerts"] if a["version"] == "2"]
    assert [(a["signal"], a["reference"], a["reference_version"]) for a in v2] == [
        ("latency_p95", "previous_champion", "1")]
    assert any(n.startswith("v2 vs first_week") for n in result["notices"])
    assert result["versions"]["2"]["references"]["previous_champion"]["requests"] == 7 * 40


# --------------------------------------------------------------------------- the CLI


def _log(rows, feedback) -> None:
    """Through the request log's public writers (what serving calls)."""
    from mlops.requestlog import Feedback, LoggedRequest, write_feedback, write_requests

    known = {f.name for f in fields(LoggedRequest)}
    write_requests([LoggedRequest(**{k: v for k, v in r.items() if k in known}) for r in rows])
    for fb in feedback:
        write_feedback(Feedback(fb["request_id"], fb["rating"], fb["correction"], source=fb["source"], ts=fb["ts"]))


@pytest.fixture
def served(mlops_home, monkeypatch):
    """The request log's readers over rows held in memory: the CLI's own reading, filtering and judging, without
    the store's write cost (the slow test below goes through the real writers)."""
    import mlops.requestlog as requestlog

    held = {"rows": [], "feedback": []}

    def read_requests(*, model=None, version=None, role=None, since=None, **_):
        return [dict(r) for r in held["rows"] if (model is None or r["model"] == model)
                and (version is None or r["version"] == version) and (role is None or r["role"] == role)
                and (since is None or r["ts"] >= since)]

    def read_feedback(*, since=None, request_ids=None, **_):
        wanted = None if request_ids is None else set(request_ids)
        return [dict(f) for f in held["feedback"] if (since is None or f["ts"] >= since)
                and (wanted is None or f["request_id"] in wanted)]

    monkeypatch.setattr(requestlog, "read_requests", read_requests)
    monkeypatch.setattr(requestlog, "read_feedback", read_feedback)
    return held


def _monitor(*args):
    from typer.testing import CliRunner

    from mlops.cli import _register_stages, app

    _register_stages()
    return CliRunner().invoke(app, ["monitor", "support-bot", *args])


def _planted(seed: int, now: float, per_day: int = 20):
    return traffic(random.Random(seed), version="1", start=now - 11 * DAY, days=11, per_day=per_day,
                   drop_from=now - 3 * DAY, drop={"thumbs_down": 0.5})


def test_mlops_monitor_exits_1_on_a_planted_drop_with_a_prometheus_alert(served, tmp_path):
    served["rows"], served["feedback"] = _planted(11, time.time())
    prom = tmp_path / "textfile" / "monitor.prom"
    done = _monitor("--days", "10", "--textfile", str(prom))
    assert done.exit_code == 1, done.output
    assert "ALERT v1 thumbs_down" in done.output
    text = prom.read_text()
    assert 'mlops_monitor_alert{model="support-bot",reference="first_week",signal="thumbs_down",version="1"} 1.0' \
        in text
    assert 'signal="refusal",version="1"} 0.0' in text
    report = json.loads(_monitor("--days", "10", "--json").output)
    assert report["versions"]["1"]["recent"]["requests"] == 60
    assert [a["signal"] for a in report["alerts"]] == ["thumbs_down"]


def test_mlops_monitor_exits_0_on_noise(served):
    served["rows"], served["feedback"] = traffic(random.Random(12), version="1", start=time.time() - 11 * DAY,
                                                 days=11, per_day=20)
    done = _monitor("--days", "10")
    assert done.exit_code == 0, done.output
    assert "0 alert(s)" in done.output and "default monitor policy" in done.output


def test_a_window_without_traffic_exits_3_naming_the_window_and_the_fix(served):
    from mlops.errors import MLOpsError

    served["rows"], served["feedback"] = traffic(random.Random(13), version="1", start=time.time() - 40 * DAY,
                                                 days=2, per_day=5)
    done = _monitor("--days", "7")
    assert isinstance(done.exception, MLOpsError) and done.exception.exit_code == 3
    message = str(done.exception)
    assert "no served traffic of 'support-bot'" in message and "7 days" in message and "Fix: widen" in message


@pytest.mark.slow
def test_mlops_monitor_reads_what_serving_wrote_and_flags_the_drop(mlops_home, monkeypatch):
    now = time.time()
    rows, feedback = _planted(14, now, per_day=20)
    _log(rows, feedback)
    done = _monitor("--days", "10", "--json")
    assert done.exit_code == 1, done.output
    report = json.loads(done.output)
    assert [(a["signal"], a["reference"]) for a in report["alerts"]] == [("thumbs_down", "first_week")]
    assert report["versions"]["1"]["recent"]["thumbs_down"]["k"] == sum(f["ts"] >= now - 3 * DAY for f in feedback)
    assert report["versions"]["1"]["recent"]["repeat"]["n"] == 60  # the sending key came back with each answer


def test_the_alert_rules_query_the_gauges_the_monitor_writes(tmp_path):
    import re

    import yaml

    from evaluation.monitor_cli import write_textfile
    from registry.config import MonitorPolicy
    from tests.conftest import REPO

    rows, feedback = traffic(random.Random(5), version="1", start=NOW - 14 * DAY, days=14, per_day=60,
                             drop_from=NOW - 3 * DAY, drop={"thumbs_down": 0.3})
    result = {**judge(rows, feedback), "policy": MonitorPolicy().model_dump()}
    write_textfile(tmp_path / "m.prom", result)
    written = set(re.findall(r"^(mlops_monitor_\w+)\{", (tmp_path / "m.prom").read_text(), re.MULTILINE))
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"][0]["rules"]
    queried = {name for rule in rules for name in re.findall(r"mlops_monitor_\w+", rule["expr"])}
    assert queried and queried <= written


def test_the_previous_champion_is_read_however_long_ago_it_was_displaced(served):
    """v1 was champion 60-40 days ago; v2 since: v2's recent days are judged against v1's last week as champion."""
    from evaluation.monitor import champion_periods
    from evaluation.monitor_cli import read_answers
    from registry.config import MonitorPolicy

    now = time.time()
    old_rows, _ = traffic(random.Random(31), version="1", start=now - 60 * DAY, days=20, per_day=5, prefix="old")
    new_rows, _ = traffic(random.Random(32), version="2", start=now - 40 * DAY, days=40, per_day=5, prefix="new")
    served["rows"] = old_rows + new_rows
    periods = champion_periods([_promotion(1, "1", None, now - 60 * DAY), _promotion(2, "2", "1", now - 40 * DAY)])
    answers = read_answers("support-bot", days=7, policy=MonitorPolicy(), periods=periods, now=now)
    assert {a.version for a in answers} == {"1", "2"}
