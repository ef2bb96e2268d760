"""`mlops registry report`: the serving switches come from the request log's answered user requests, and the
rendered report says what each part of the stored state holds."""

from __future__ import annotations


def _served(request_id: str, version: str, ts: float, *, status: int = 200, role: str = "user"):
    from mlops.requestlog import LoggedRequest

    return LoggedRequest(request_id, "bot", version, "/v1/chat/completions", [{"role": "user", "content": "hi"}],
                         "hello", status=status, role=role, ts=ts)


def test_serving_switches_are_the_first_answer_of_each_version_users_got(traced_home):
    from mlops.requestlog import write_requests
    from registry.report import serving_switches

    write_requests([_served("a", "1", 100.0), _served("b", "1", 101.0), _served("typo", "1", 101.5, status=404),
                    _served("c", "2", 102.0), _served("c:shadow", "3", 102.5, role="shadow"),
                    _served("refused", "1", 103.0, status=400), _served("d", "2", 104.0), _served("e", "1", 105.0)])
    switches = serving_switches("bot")
    assert [(s["from"], s["to"], s["request_id"]) for s in switches] == [(None, "1", "a"), ("1", "2", "c"),
                                                                          ("2", "1", "e")]
    assert switches[1]["ts"] == "1970-01-01T00:01:42Z"


def test_render_names_versions_gates_ledger_and_switches():
    from registry.report import render

    report = {"model": "bot", "created": "2026-12-01T00:00:00Z", "aliases": {"production": "1"}, "pending": [],
              "ledger_verified": True,
              "versions": [{"version": "1", "stage": "production", "stage_reason": None, "aliases": ["production"],
                            "trainer": "ada", "registered_by": "ada", "content_id": "mc-1", "run_id": "r1",
                            "snapshot_id": "snap-1", "data_run_id": "d1", "blocking": [],
                            "gate": {"gate_run": "g1", "result": "passed", "champion": None, "reasons": [],
                                     "eval_run": "e1",
                                     "scores": {"business": {"value": 0.33, "half_width": 0.06, "n": 168}},
                                     "main_deltas": [{"name": "business", "against": "must_beat",
                                                      "rule": "must_beat", "delta": 0.14, "lo": 0.27, "hi": 0.39,
                                                      "passed": True}]}},
                           {"version": "2", "stage": "candidate", "stage_reason": None, "aliases": [],
                            "trainer": "ada", "registered_by": "ada", "content_id": "mc-2", "run_id": "r2",
                            "snapshot_id": "snap-2", "data_run_id": None, "gate": None,
                            "blocking": [{"gate": "contamination", "detail": "4 eval items overlap"}]}],
              "ledger": [{"seq": 1, "ts": "t1", "actor": "ada", "action": "register", "version": "1",
                          "from_stage": None, "to_stage": "candidate", "alias": None, "alias_before": None,
                          "alias_after": None, "reason": "from training run r1"}],
              "serving": [{"ts": "t2", "from": None, "to": "1", "request_id": "a"}]}
    text = render(report)
    assert "Release report of bot (@production=v1)" in text
    assert "v1 production @production: run r1, snapshot snap-1, data run d1, trained by ada" in text
    assert "gate passed on floors (no champion) (gate run g1)" in text
    assert "score business: 0.330 ± 0.060 (n = 168)" in text
    assert "business vs must_beat (must_beat): +0.140 from it, score interval [0.270, 0.390] ok" in text
    assert "v2 candidate" in text and "no stored gate report" in text
    assert "blocks production now: contamination: 4 eval items overlap" in text
    assert "hash chain verified" in text and "#1 t1 ada    register" in text
    assert "t2 v- -> v1 (request a)" in text
