"""`mlops shadow report` / `shadow_evidence`: agreement, length and latency deltas, refusals, errors, win rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest


def _log_pairs() -> None:
    from mlops.requestlog import Feedback, LoggedRequest, write_feedback, write_requests

    msgs = [{"role": "user", "content": "Where is my order?"}]
    route = "/v1/chat/completions"

    def pair(rid, user, shadow, *, tokens, latency, status=200, version="2"):
        return [LoggedRequest(rid, "bot", "1", route, msgs, user, tokens_out=tokens[0], latency_ms=latency[0]),
                LoggedRequest(f"{rid}:shadow", "bot", version, route, msgs, shadow, status=status, role="shadow",
                              parent_id=rid, tokens_out=tokens[1], latency_ms=latency[1])]

    rows = [
        *pair("u1", "The parcel ships Monday.", "  The parcel\nships Monday. ", tokens=(5, 5), latency=(100, 120)),
        *pair("u2", "Your order ships on Monday from Berlin", "Your order ships Tuesday", tokens=(7, 4),
              latency=(200, 150)),
        *pair("u3", "Sorry to hear that. It left today.", "I'm sorry, but I can't help with that.", tokens=(8, 10),
              latency=(300, 400)),
        *pair("u4", "Fine.", "", tokens=(1, 0), latency=(50, 50), status=500),
        LoggedRequest("gone:shadow", "bot", "2", route, msgs, "x", role="shadow", parent_id="gone"),  # user row pruned
        LoggedRequest("u1:shadow3", "bot", "3", route, msgs, "other candidate", role="shadow", parent_id="u1"),
    ]
    write_requests(rows)
    write_feedback(Feedback("u2", -1, correction="It ships on Tuesday"))


def test_shadow_evidence_compares_the_candidate_with_what_users_got(traced_home):
    from evaluation.shadow import shadow_evidence

    _log_pairs()
    report = shadow_evidence("bot", "2", scorer="reference_overlap")
    assert (report["shadowed"], report["unpaired"], report["compared"]) == (5, 1, 3)
    assert report["errors"] == {"user": 0, "shadow": 1} and report["error_rate"]["shadow"] == 0.25
    assert report["champions"] == {"1": 4}
    assert report["agreement"]["exact"] == pytest.approx(1 / 3, abs=1e-4)
    # word F1 per pair: 1, 18/33 (3 shared words of 7 and 4), 4/17 (2 of 7 and 10)
    assert report["agreement"]["token_overlap"] == pytest.approx((1 + 18 / 33 + 4 / 17) / 3, abs=1e-4)
    assert report["length"]["user_mean_tokens"] == pytest.approx(20 / 3, abs=1e-4)
    assert report["length"]["shadow_mean_tokens"] == pytest.approx(19 / 3, abs=1e-4)
    assert report["length"]["ratio"] == pytest.approx(0.95, abs=1e-3)
    assert report["latency_ms"] == {"user_p50": 200, "user_p95": 300, "shadow_p50": 150, "shadow_p95": 400,
                                    "delta_p50": -50, "delta_p95": 100}
    assert report["refusal_rate"]["user"] == 0 and report["refusal_rate"]["shadow"] == pytest.approx(1 / 3, abs=1e-4)
    # only u2 was corrected; the candidate's "ships Tuesday" is closer to "It ships on Tuesday"
    assert report["win_rate"] == {"scorer": "reference_overlap", "judged": 1, "wins": 1, "ties": 0, "losses": 0,
                                  "rate": 1.0}
    assert shadow_evidence("bot", "2")["win_rate"] is None
    assert shadow_evidence("bot", "2", since=time.time() + 60)["shadowed"] == 0


def test_refusal_detector_and_since_parsing():
    from evaluation.shadow import is_refusal, parse_since
    from mlops.errors import ConfigError

    for text in ("I'm sorry, but I cannot share that.", "As an AI, I have no parcels.", "I can't help with that.",
                 "I am unable to assist with refunds."):
        assert is_refusal(text), text
    for text in ("Sorry for the delay: it ships Monday.", "You can't return opened items after 30 days.",
                 "We cannot ship to PO boxes."):
        assert not is_refusal(text), text
    assert parse_since("2h", now=10_000) == 10_000 - 7200 and parse_since("1700000000") == 1_700_000_000
    assert parse_since("2026-01-01T00:00") == 1767225600
    with pytest.raises(ConfigError, match="--since 'yesterday'"):
        parse_since("yesterday")


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_shadow_report_cli_prints_json_and_names_unknown_scorers(traced_home):
    from evaluation.shadow import shadow_evidence

    _log_pairs()
    env = {**os.environ, "MLOPS_HOME": str(traced_home)}
    out = subprocess.run([sys.executable, "-m", "mlops", "shadow", "report", "bot", "2", "--json", "--scorer",
                          "reference_overlap"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    stored = printed.pop("run_id")  # the report is stored too: the evidence the registry's shadow gate reads
    assert printed == json.loads(json.dumps(shadow_evidence("bot", "2", scorer="reference_overlap")))
    from mlops.run_store import load_run_json

    assert load_run_json(stored, "shadow/shadow_report.json") == printed
    table = subprocess.run([sys.executable, "-m", "mlops", "shadow", "report", "bot", "2"], capture_output=True,
                           text=True, env=env, timeout=300)
    assert table.returncode == 0 and "5 shadowed, 3 compared" in table.stdout
    bad = subprocess.run([sys.executable, "-m", "mlops", "shadow", "report", "bot", "2", "--scorer", "reference"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0 and "did you mean" in bad.stderr + bad.stdout and "Traceback" not in bad.stderr
