"""Suites: registered by name, versioned by an item fingerprint, well-formed items; local scorers."""

from __future__ import annotations

import shutil

import pytest

from evaluation import metrics
from evaluation.suites import get_suites, items_fingerprint, load_suite, task_config
from mlops.errors import MLOpsError, NotFoundError

DIMENSIONS = {"refunds_returns", "order_shipping", "account_security", "billing", "troubleshooting",
              "escalation_tone", "safety_refusals"}


def test_unknown_suite_name_answers_with_the_available_ones():
    with pytest.raises(NotFoundError, match="did you mean 'general'.*available: business, general"):
        get_suites("genral")


def test_shipped_suites_match_their_recorded_fingerprints():
    for suite in get_suites("general,business"):
        assert suite.fingerprint == items_fingerprint(suite.folder) and suite.version >= 1


def test_editing_an_item_without_bumping_the_version_is_refused(tmp_path):
    folder = tmp_path / "general"
    shutil.copytree(get_suites("general")[0].folder, folder)
    with (folder / "knowledge_mc.jsonl").open("a") as fh:
        fh.write('{"id": "gk-999", "prompt": "new?", "choices": ["a", "b"], "answer": 0}\n')
    with pytest.raises(MLOpsError, match="bump `version`"):
        load_suite(folder)


def test_items_are_well_formed_with_unique_ids_and_valid_answers():
    for suite in get_suites("general,business"):
        ids = set()
        for task in suite.tasks:
            items = task.items()
            assert items, task.name
            for item in items:
                assert item["id"] not in ids and item["prompt"].strip()
                ids.add(item["id"])
                if task.kind == "multiple_choice":
                    assert len(item["choices"]) == 4 and len(set(item["choices"])) == 4
                    assert 0 <= item["answer"] < 4
                elif task.scorer == "checks":
                    assert item["checks"] and all(c["type"] for c in item["checks"])
                else:
                    assert str(item["target"]).strip()


def test_suite_sizes_and_business_dimensions():
    general, business = get_suites("general,business")
    assert 250 <= sum(len(t.items()) for t in general.tasks) <= 400
    per_dim: dict[str, int] = {}
    for task in business.tasks:
        per_dim[task.area] = per_dim.get(task.area, 0) + len(task.items())
        assert all(item["dimension"] == task.area for item in task.items())
    assert set(per_dim) == DIMENSIONS
    assert all(30 <= n <= 50 for n in per_dim.values()) and 240 <= sum(per_dim.values()) <= 300
    kinds = {(t.area, t.kind) for t in business.tasks}
    assert all((d, k) in kinds for d in DIMENSIONS for k in ("multiple_choice", "generate"))


def test_task_configs_are_local_json_tasks_with_suite_versions():
    suite = get_suites("business")[0]
    config = task_config(suite, suite.task("biz_billing_gen"))
    assert config["dataset_path"] == "json" and config["metadata"]["version"] == suite.version
    assert config["process_results"]({"target": "14", "aliases": []}, ["14"])["exact_match"] == 1.0


def test_arithmetic_builder_reproduces_the_committed_items():
    import random
    import runpy

    suite = get_suites("general")[0]
    builder = runpy.run_path(str(suite.folder / "make_arithmetic.py"))
    rebuilt = builder["items"](random.Random(20260101))
    assert rebuilt == suite.task("general_arithmetic").items()
    assert all(str(int(i["target"])) == i["target"] for i in rebuilt)  # plain integers


@pytest.mark.parametrize("output,target,aliases,em,f1", [
    ("30 days", "30 days", [], 1.0, 1.0),
    ("You have 30 days.", "30 days", [], 0.0, 2 / 3),  # P = 2/4, R = 2/2
    ("The original payment method", "the original payment method", [], 1.0, 1.0),
    ("email", "by email", ["email"], 1.0, 1.0),
    ("nothing relevant", "5-7 business days", [], 0.0, 0.0),
])
def test_squad_scores_match_the_squad_definitions(output, target, aliases, em, f1):
    scores = metrics.score_squad({"target": target, "aliases": aliases}, output)
    assert scores["exact_match"] == em and scores["f1"] == pytest.approx(f1)


def test_number_scorer_takes_the_last_number():
    assert metrics.score_number({"target": "42"}, "6 times 7 is 42.")["exact_match"] == 1.0
    assert metrics.score_number({"target": "42"}, "42 or maybe 41")["exact_match"] == 0.0
    assert metrics.score_number({"target": "1200"}, "1,200")["exact_match"] == 1.0


@pytest.mark.parametrize("spec,output,ok", [
    ({"type": "exact_case", "value": "CAT"}, "CAT", True),
    ({"type": "exact_case", "value": "CAT"}, "cat", False),
    ({"type": "max_words", "n": 3}, "one two three four", False),
    ({"type": "upper"}, "TRAINS ARE FAST.", True),
    ({"type": "no_char", "value": "e"}, "A big cat", True),
    ({"type": "lines", "n": 2}, "red\nblue", True),
    ({"type": "json_keys", "keys": ["name", "age"]}, '{"name": "Sam", "age": 30}', True),
    ({"type": "json_keys", "keys": ["name", "age"]}, "name: Sam", False),
    ({"type": "excludes", "values": ["food"]}, "Cooking is fun", True),
    ({"type": "ends_with", "value": "?"}, "What is your favourite book?", True),
])
def test_instruction_checks(spec, output, ok):
    assert metrics.check(spec, output) is ok
