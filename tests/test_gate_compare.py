"""The gate on constructed eval summaries: non-inferiority, no regression, must-improve, floors, history."""

from __future__ import annotations

import json
import math

import pytest

from evaluation.config import GateConfig
from evaluation.gate import compare, scores_of
from evaluation.report import to_markdown, write_report
from evaluation.results import Score, area_scores, summary


def _se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / (n - 1))


def make_summary(general: dict[str, float], business: dict[str, float], n: int = 100, version: int = 1) -> dict:
    """An eval summary with binomial stderrs: general tasks, and one task per business dimension."""
    tasks = [Score(name, "general", name, "acc", v, _se(v, n), n) for name, v in general.items()]
    tasks += [Score(f"biz_{d}_mc", "business", d, "acc", v, _se(v, n), n) for d, v in business.items()]
    doc = summary(tasks, [])
    doc["suites"] = {"general": {"version": version}, "business": {"version": version}}
    return doc


CHAMPION = make_summary({"general_knowledge": 0.60, "general_reading": 0.70},
                        {"refunds_returns": 0.70, "billing": 0.60})


def test_challenger_within_noise_and_better_business_passes():
    challenger = make_summary({"general_knowledge": 0.59, "general_reading": 0.71},
                              {"refunds_returns": 0.85, "billing": 0.62})
    report = compare(challenger, CHAMPION, GateConfig(must_improve=["refunds_returns"]))
    assert report.passed, report.reasons
    rules = {(c.name, c.rule) for c in report.checks}
    assert ("general_knowledge", "non_inferior") in rules and ("refunds_returns", "must_improve") in rules
    assert ("billing", "no_regression") in rules


def test_general_drop_beyond_margin_and_noise_fails():
    challenger = make_summary({"general_knowledge": 0.35, "general_reading": 0.70},
                              {"refunds_returns": 0.70, "billing": 0.60})
    report = compare(challenger, CHAMPION, GateConfig())
    assert not report.passed
    assert len(report.reasons) == 1 and "general_knowledge is inferior" in report.reasons[0]


def test_business_dimension_regression_fails_and_must_improve_needs_evidence():
    challenger = make_summary({"general_knowledge": 0.60, "general_reading": 0.70},
                              {"refunds_returns": 0.72, "billing": 0.40})
    report = compare(challenger, CHAMPION, GateConfig(must_improve=["refunds_returns"]))
    failed = {c.name: c.rule for c in report.checks if not c.passed}
    assert failed == {"billing": "no_regression", "refunds_returns": "must_improve"}


def test_strict_mode_fails_what_noise_tolerant_mode_lets_through():
    challenger = make_summary({"general_knowledge": 0.55, "general_reading": 0.70},
                              {"refunds_returns": 0.70, "billing": 0.60})
    assert compare(challenger, CHAMPION, GateConfig(mode="noise_tolerant")).passed
    strict = compare(challenger, CHAMPION, GateConfig(mode="strict"))
    assert not strict.passed and {c.name for c in strict.checks if not c.passed} >= {"general_knowledge"}


def test_interval_uses_both_runs_stderr():
    challenger = make_summary({"general_knowledge": 0.50}, {})
    report = compare(challenger, make_summary({"general_knowledge": 0.60}, {}), GateConfig(z=2.0))
    check = report.checks[0]
    half = 2.0 * math.sqrt(_se(0.5, 100) ** 2 + _se(0.6, 100) ** 2)
    assert check.delta == pytest.approx(-0.1) and check.lo == pytest.approx(-0.1 - half)
    assert check.hi == pytest.approx(-0.1 + half)


def test_no_champion_applies_absolute_floors():
    challenger = make_summary({"general_knowledge": 0.50, "general_reading": 0.20},
                              {"refunds_returns": 0.70, "billing": 0.60})
    cfg = GateConfig(floors={"general": 0.4, "billing": 0.9})
    report = compare(challenger, None, cfg)
    assert report.champion is None and "no champion" in report.notes[0]
    failed = sorted(c.name for c in report.checks if not c.passed)
    assert failed == ["billing", "general_reading"]
    assert compare(challenger, None, GateConfig(floors={"general": 0.1, "business": 0.5})).passed


def test_capability_lost_two_releases_ago_is_caught_through_history():
    v1 = make_summary({"general_knowledge": 0.60}, {"refunds_returns": 0.80})
    v2 = make_summary({"general_knowledge": 0.60}, {"refunds_returns": 0.71})  # within noise of v1
    v3 = make_summary({"general_knowledge": 0.60}, {"refunds_returns": 0.62})  # within noise of v2
    assert compare(v2, v1, GateConfig()).passed
    assert compare(v3, v2, GateConfig()).passed  # the champion alone misses the slow slide
    report = compare(v3, v2, GateConfig(), champion_label="models:/bot/2", history=[("models:/bot/1", v1)])
    assert not report.passed
    assert [(c.name, c.against) for c in report.checks if not c.passed] == [("refunds_returns", "models:/bot/1")]


def test_missing_task_and_suite_version_mismatch_fail():
    challenger = make_summary({"general_knowledge": 0.60}, {"refunds_returns": 0.70, "billing": 0.60})
    report = compare(challenger, CHAMPION, GateConfig())
    assert any("general_reading was evaluated for champion but not for the challenger" in r for r in report.reasons)
    other = make_summary({"general_knowledge": 0.60, "general_reading": 0.70},
                         {"refunds_returns": 0.70, "billing": 0.60}, version=2)
    assert any("re-evaluate champion on the same version" in r for r in compare(other, CHAMPION, GateConfig()).reasons)


def test_business_dimensions_aggregate_their_tasks_weighted_by_items():
    tasks = [Score("biz_billing_mc", "business", "billing", "acc", 0.5, 0.1, 30),
             Score("biz_billing_gen", "business", "billing", "f1", 0.8, 0.05, 10)]
    (billing,) = area_scores(tasks)
    assert billing.value == pytest.approx(0.575) and billing.n == 40
    assert billing.stderr == pytest.approx(math.sqrt((0.75 * 0.1) ** 2 + (0.25 * 0.05) ** 2))
    assert set(scores_of(summary(tasks, []))) == {"billing"}


def test_report_is_written_as_json_and_markdown(tmp_path):
    challenger = make_summary({"general_knowledge": 0.35, "general_reading": 0.70},
                              {"refunds_returns": 0.70, "billing": 0.60})
    report = compare(challenger, CHAMPION, GateConfig(), challenger_label="models:/bot/3",
                     champion_label="models:/bot@production")
    json_path, md_path = write_report(report, tmp_path)
    data = json.loads(json_path.read_text())
    assert data["result"] == "failed" and data["reasons"] and len(data["checks"]) == 4
    markdown = md_path.read_text()
    assert markdown.startswith("# Gate report: FAILED")
    assert "| general_knowledge | models:/bot@production | non_inferior | 0.350 | 0.600 | -0.250 |" in markdown
    assert "**FAIL**" in markdown and to_markdown(report) == markdown


def test_first_release_must_beat_the_base_model_on_the_business_suite_as_a_whole():
    # Each dimension alone is within noise of the base score, the suite's 400 items together are not.
    base = {"business": 0.20}
    better = make_summary({"general_knowledge": 0.6}, {d: 0.27 for d in ("refunds", "billing", "tone", "safety")})
    report = compare(better, None, GateConfig(must_beat=base))
    check = next(c for c in report.checks if c.rule == "must_beat")
    assert report.passed and check.name == "business" and check.lo > 0.20
    assert check.challenger == pytest.approx(0.27)

    level = make_summary({"general_knowledge": 0.6}, {d: 0.21 for d in ("refunds", "billing", "tone", "safety")})
    refused = compare(level, None, GateConfig(must_beat=base))
    assert not refused.passed
    assert "business scores 0.210" in refused.reasons[0] and "does not beat 0.200" in refused.reasons[0]


def test_must_beat_applies_with_a_champion_and_names_what_it_cannot_find():
    challenger = make_summary({"general_knowledge": 0.60, "general_reading": 0.70},
                              {"refunds_returns": 0.70, "billing": 0.60})
    report = compare(challenger, CHAMPION, GateConfig(must_beat={"billing": 0.65, "biz_nothing": 0.1}))
    failed = {c.name: c.rule for c in report.checks if not c.passed}
    assert failed == {"billing": "must_beat", "biz_nothing": "coverage"}
    assert "| must_beat |" in to_markdown(report)


def test_a_floor_is_not_failed_by_zero_of_a_few_items_whose_observed_stderr_is_zero():
    # 0 of 12 against a floor of 1 of 12: within noise. 0 of 400 against the same floor: below it.
    few = summary([Score("general_arithmetic", "general", "general_arithmetic", "exact_match", 0.0, 0.0, 12)], [])
    many = summary([Score("general_arithmetic", "general", "general_arithmetic", "exact_match", 0.0, 0.0, 400)], [])
    cfg = GateConfig(floors={"general_arithmetic": 0.083})
    assert compare(few, None, cfg).passed
    refused = compare(many, None, cfg)
    assert not refused.passed and "below its floor 0.083" in refused.reasons[0]
