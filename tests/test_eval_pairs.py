"""Held-out pair accuracy (the `pairs` suite written from a preference snapshot) and the gate that holds a DPO
candidate to beating the champion on it beyond the interval."""

from __future__ import annotations

import json

import pytest

from evaluation.config import GateConfig
from evaluation.gate import compare
from mlops.errors import ConfigError


@pytest.fixture
def pair_snapshot(tiny_model, tmp_path, mlops_home):
    from mlops.data.labelled_dedup import conversations
    from mlops.data.testing import quick_build

    asked, other = conversations(40, 1), conversations(40, 101)
    records = [{"prompt": a["messages"][0]["content"], "chosen": a["messages"][1]["content"],
                "rejected": b["messages"][1]["content"]} for a, b in zip(asked, other, strict=True)]
    result = quick_build(records, base_model=tiny_model["path"], workdir=tmp_path, name="pairs.jsonl",
                         record_type="preference", validation_fraction=0.3)
    return {"id": result.snapshot_id, "records": records}


def test_the_pairs_suite_holds_out_the_validation_pairs_with_the_chosen_answer_alternating(pair_snapshot, tiny_model,
                                                                                       tmp_path):
    from evaluation.pairs import TASK, write_pair_suite
    from evaluation.suites import load_suite

    folder = write_pair_suite(pair_snapshot["id"], tmp_path / "suites", tokenizer_path=tiny_model["path"])
    suite = load_suite(folder)  # the fingerprint holds
    assert suite.name == "pairs" and [t.name for t in suite.tasks] == [TASK]
    task = suite.tasks[0]
    assert task.rendered and task.target_delimiter == "" and task.primary == "acc"
    items = task.items()
    assert len(items) >= 4 and {item["answer"] for item in items} == {0, 1}
    answers = {r["chosen"]: r["rejected"] for r in pair_snapshot["records"]}
    for item in items:
        chosen = item["choices"][item["answer"]]
        rejected = item["choices"][1 - item["answer"]]
        match = next(c for c in answers if chosen.startswith(c))  # the answer ends with the end-of-turn token
        assert rejected.startswith(answers[match])
        assert item["prompt"].rstrip().endswith("assistant")  # rendered as trained, up to the answer


def test_pairs_a_judged_model_was_trained_on_are_left_out_of_the_suite(pair_snapshot, tiny_model, tmp_path):
    from pathlib import Path

    from transformers import AutoTokenizer

    from evaluation.config import ContaminationConfig
    from evaluation.pairs import seen_in_training, suite_ids, write_pair_suite
    from evaluation.suites import load_suite
    from mlops.data.format import write_snapshot
    from mlops.model_refs import ResolvedModel

    folder = write_pair_suite(pair_snapshot["id"], tmp_path / "suites", tokenizer_path=tiny_model["path"])
    items = load_suite(folder).tasks[0].items()
    asked = next(r for r in pair_snapshot["records"] if r["prompt"] in items[0]["prompt"])
    tok = AutoTokenizer.from_pretrained(tiny_model["path"])
    text = tok.apply_chat_template([{"role": "user", "content": asked["prompt"]},
                                    {"role": "assistant", "content": asked["chosen"]}], tokenize=False)
    trained = write_snapshot({"train": [tok(text).input_ids]}, seq_len=256).name
    champion = ResolvedModel("models:/bot/1", Path(tiny_model["path"]), "registry",
                             run_tags={"mlops.data_snapshot_id": trained})
    seen = seen_in_training(folder, [champion], ContaminationConfig())
    assert seen == {"models:/bot/1": [items[0]["id"]]}
    folder = write_pair_suite(pair_snapshot["id"], tmp_path / "suites", tokenizer_path=tiny_model["path"],
                              leave_out=set(seen["models:/bot/1"]))
    assert suite_ids(folder) == [item["id"] for item in items[1:]]
    load_suite(folder)  # rewritten with its own fingerprint
    with pytest.raises(ConfigError, match=r"not trained on \(\d+ left out\).*Fix"):
        write_pair_suite(pair_snapshot["id"], tmp_path / "suites", tokenizer_path=tiny_model["path"],
                         leave_out={item["id"] for item in items})


def test_a_chat_snapshot_is_no_pairs_suite(train_snapshot, tiny_model, tmp_path):
    from evaluation.pairs import write_pair_suite

    with pytest.raises(ConfigError, match="not preference pairs"):
        write_pair_suite(train_snapshot, tmp_path, tokenizer_path=tiny_model["path"])


def test_lm_eval_scores_the_rendered_pairs_without_rendering_them_again(pair_snapshot, tiny_model, tmp_path):
    from lm_eval.tasks import TaskManager, get_task_dict

    from evaluation.pairs import TASK, write_pair_suite
    from evaluation.suites import load_suite, task_config

    suite = load_suite(write_pair_suite(pair_snapshot["id"], tmp_path / "s", tokenizer_path=tiny_model["path"]))
    config = task_config(suite, suite.tasks[0])
    assert config["target_delimiter"] == "" and config["metadata"]["rendered"] is True
    task = get_task_dict([config], TaskManager(include_defaults=False))[TASK]
    doc = next(iter(task.test_docs()))
    requests = task.construct_requests(doc, task.doc_to_text(doc))
    assert [r.arguments[1] for r in requests] == doc["choices"]  # the answers as continuations, no space added
    assert requests[0].arguments[0] == doc["prompt"]


def _summary(pairs: float | None, n: int = 200, business: float = 0.8) -> dict:
    import math

    tasks = [{"name": "knowledge_mc", "suite": "general", "area": "knowledge", "metric": "acc_norm", "value": 0.5,
              "stderr": 0.03, "n": 200}]
    areas = [{"name": "billing", "suite": "business", "area": "billing", "metric": "acc_norm", "value": business,
              "stderr": 0.03, "n": 200, "kind": "area"}]
    if pairs is not None:
        tasks.append({"name": "pairs_heldout", "suite": "pairs", "area": "preference", "metric": "acc",
                      "value": pairs, "stderr": math.sqrt(pairs * (1 - pairs) / n), "n": n})
    return {"tasks": tasks, "areas": areas, "suites": {}}


def test_the_gate_passes_a_candidate_whose_pair_accuracy_beats_the_champions_beyond_the_interval():
    cfg = GateConfig(must_improve=["pairs_heldout"])
    report = compare(_summary(0.80), _summary(0.60), cfg)
    assert report.passed, report.reasons
    close = compare(_summary(0.63), _summary(0.60), cfg)
    assert not close.passed and any("pairs_heldout" in r for r in close.reasons)


def test_the_gate_refuses_a_pair_accuracy_win_that_costs_a_business_dimension():
    report = compare(_summary(0.85, business=0.5), _summary(0.60), GateConfig(must_improve=["pairs_heldout"]))
    assert not report.passed and any("billing" in r for r in report.reasons)


def test_a_champion_never_scored_on_the_pairs_is_no_silent_pass():
    report = compare(_summary(0.90), _summary(None), GateConfig(must_improve=["pairs_heldout"]))
    assert not report.passed
    assert any("evaluate champion on the same suite" in r for r in report.reasons), json.dumps(report.reasons)
