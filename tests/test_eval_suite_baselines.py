"""The suites measure knowledge: no rule that ignores the meaning of the question beats chance by more than the
suite's stated margin, answers sit evenly over positions, and no generation target is spelled out in its prompt."""

from __future__ import annotations

import pytest

from evaluation.baselines import RULES, mc_baselines, rule_accuracy, suite_baselines, targets_in_prompt
from evaluation.suites import get_suites

SUITES = get_suites("general,business")
MC_TASKS = [(s, t) for s in SUITES for t in s.tasks if t.kind == "multiple_choice"]
TARGET_TASKS = [(s, t) for s in SUITES for t in s.tasks if t.kind == "generate" and t.scorer != "checks"]


@pytest.mark.parametrize(("suite", "task"), MC_TASKS, ids=[t.name for _, t in MC_TASKS])
def test_no_trivial_rule_beats_chance_beyond_the_margin(suite, task):
    figures = mc_baselines(task.items(), suite.baseline_margin)
    assert figures["outside"] == [], figures
    assert suite.baseline_margin <= 0.10  # the margin the suite states is a real constraint


@pytest.mark.parametrize(("suite", "task"), MC_TASKS, ids=[t.name for _, t in MC_TASKS])
def test_correct_answers_are_spread_over_the_positions(suite, task):
    positions = mc_baselines(task.items(), suite.baseline_margin)["positions"]
    n, k = len(task.items()), len(task.items()[0]["choices"])
    assert set(positions) == set(range(k)) and max(positions.values()) - min(positions.values()) <= max(2, n // 10)


@pytest.mark.parametrize(("suite", "task"), TARGET_TASKS, ids=[t.name for _, t in TARGET_TASKS])
def test_generation_targets_are_not_in_their_prompts(suite, task):
    assert targets_in_prompt(task.items()) == []


def test_business_multiple_choice_is_gated_on_the_metric_the_checks_chose():
    business = next(s for s in SUITES if s.name == "business")
    assert {t.primary for t in business.tasks if t.kind == "multiple_choice"} == {"acc_norm"}
    assert set(suite_baselines(business)) == {t.name for t in business.tasks if t.kind == "multiple_choice"}


def test_the_rules_catch_a_suite_that_rewards_answer_length():
    biased = [{"prompt": "How long is the return window?", "answer": 0,
               "choices": ["Thirty days from the day the parcel is delivered", "14 days", "Never", "1 year"]}] * 8
    assert rule_accuracy(biased, RULES["longest"]) == 1.0
    assert mc_baselines(biased, 0.1)["outside"] == ["first", "last", "longest", "shortest", "word_overlap"]
    tied = [{"prompt": "Which?", "answer": 1, "choices": ["14 days", "30 days", "60 days", "90 days"]}]
    assert rule_accuracy(tied, RULES["longest"]) == 0.25  # an undecided rule gets chance, not a win
    leaked = [{"id": "x", "prompt": "Answer yes or no: is it free?", "target": "no", "aliases": ["No."]}]
    assert targets_in_prompt(leaked) == [("x", "no"), ("x", "No.")]
