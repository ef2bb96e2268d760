"""The gate reads exactly the evidence it names: the version's recorded eval, else the newest eval of the same
content, profile, suites and limit; never a forced-profile eval."""

from __future__ import annotations

import pytest

from mlops.lineage import Tag

RULE_SUITES = ("business@v9", "general@v9")
KEY, PROFILE = "mc-aaaaaaaaaaaaaaaaaaaa", "p" * 16


@pytest.fixture
def store(mlops_home):
    from mlops.tracking import init_experiment

    init_experiment("gate-evidence")


def eval_run(*, key=KEY, profile=PROFILE, suites=RULE_SUITES, limit="all", forced=False, status="FINISHED",
             score=0.5) -> str:
    from mlops.tracking import MlflowTracker

    tracker = MlflowTracker.start("gate-evidence", attach_env_run=False, tags={
        Tag.STAGE: "eval", Tag.MODEL_KEY: key, Tag.PROFILE_HASH: profile, Tag.SUITE_VERSION: ",".join(suites),
        Tag.EVAL_LIMIT: limit, Tag.EVAL_FORCED_PROFILE: str(forced).lower()})
    tracker.log_dict({"tasks": [{"suite": "general", "name": "t", "value": score}], "areas": []},
                     "eval/summary.json")
    tracker.close(status)
    return tracker.run_id


def model(version_tags: dict | None = None, kind: str = "version"):
    from mlops.model_refs import ModelDescription

    return ModelDescription("models:/bot/1", kind, "bot", "1", "run0",
                            {Tag.MODEL_ID: KEY, Tag.PROFILE_HASH: PROFILE}, dict(version_tags or {}))


def rule(limit=None):
    from evaluation.gate_run import EvidenceRule

    return EvidenceRule(RULE_SUITES, limit)


def test_gate_uses_the_eval_recorded_on_the_version_over_a_newer_one(store):
    from evaluation.gate_run import find_evidence

    recorded = eval_run(score=0.1)
    eval_run(score=0.9)
    evidence = find_evidence(model({Tag.EVAL_RUN: recorded}), rule())
    assert evidence.eval_run_id == recorded and evidence.summary["tasks"][0]["value"] == 0.1


def test_without_a_recorded_eval_the_newest_matching_one_counts(store):
    from evaluation.gate_run import find_evidence

    eval_run(score=0.1)
    newest = eval_run(score=0.2)
    eval_run(key="mc-bbbbbbbbbbbbbbbbbbbb")  # another model's eval
    assert find_evidence(model(), rule()).eval_run_id == newest


def test_forced_profile_eval_can_never_satisfy_a_gate(store):
    from evaluation.gate_run import EvidenceError, find_evidence

    forced = eval_run(forced=True)
    with pytest.raises(EvidenceError, match="forced deployment profile"):
        find_evidence(model({Tag.EVAL_RUN: forced}), rule())


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"profile": "q" * 16}, "deployment profile"),
        ({"suites": ("business@v8", "general@v9")}, "ran suites business@v8,general@v9"),
        ({"suites": ("general@v9",)}, "the gate needs business@v9,general@v9"),
        ({"limit": "20"}, "eval.limit=20, the gate needs eval.limit=all"),
        ({"status": "FAILED"}, "FAILED"),
    ],
)
def test_an_eval_that_does_not_match_the_rule_is_refused_with_the_reason(store, kwargs, why):
    from evaluation.gate_run import EvidenceError, find_evidence

    run_id = eval_run(**kwargs)
    with pytest.raises(EvidenceError) as caught:
        find_evidence(model(), rule())
    assert run_id in str(caught.value) and why in str(caught.value)
    assert "Fix: run `mlops eval --model models:/bot/1" in str(caught.value)


def test_a_limited_eval_counts_when_the_gate_config_declares_that_limit(store):
    from evaluation.gate_run import find_evidence

    limited = eval_run(limit="20")
    assert find_evidence(model(), rule(limit=20)).eval_run_id == limited


def test_a_model_with_no_eval_at_all_is_refused(store):
    from evaluation.gate_run import EvidenceError, find_evidence

    with pytest.raises(EvidenceError, match="no eval run of this content at all"):
        find_evidence(model(), rule())


def test_an_eval_of_the_run_ref_is_evidence_for_the_version_of_the_same_weights(store):
    """Evaluating `runs:/<id>/model` and then gating `models:/bot/1` (the same weights, registered) finds that eval:
    evidence is keyed on the content id, not on how the model was referenced."""
    from evaluation.gate_run import find_evidence
    from mlops.model_refs import ModelDescription

    as_run = ModelDescription("runs:/run0/model", "run", None, None, "run0",
                              {Tag.MODEL_ID: KEY, Tag.PROFILE_HASH: PROFILE}, {})
    evaluated = eval_run(key=as_run.content_id, score=0.4)  # what `mlops eval --model runs:/run0/model` keys on
    evidence = find_evidence(model(), rule())
    assert evidence.eval_run_id == evaluated and evidence.key == KEY
