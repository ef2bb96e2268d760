"""Contamination: eval items against the training snapshot named by the model's lineage, under the rule the
snapshot's decontamination used, so a snapshot that passed decontamination reports nothing."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evaluation.config import ContaminationConfig
from evaluation.contamination import contamination_for_model, contamination_report, rule_of, suite_items
from evaluation.suites import SUITES_DIR, get_suites
from mlops.data.config import ContaminationRule
from mlops.data.testing import quick_build
from mlops.model_refs import ResolvedModel

ITEM = {"id": "x-1", "prompt": "How many days after delivery does a customer have to return an item?",
        "choices": ["14 days", "30 days", "60 days", "90 days"], "answer": 1}


def test_items_held_by_a_training_message_are_reported_with_evidence():
    clean = {"id": "x-2", "prompt": "Which metal is liquid at room temperature?", "target": "Mercury"}
    short = {"id": "x-3", "prompt": "Reply yes.", "target": "yes"}
    samples = [("s1", ["Hi", "Agent notes: how many days after the delivery does a customer have to return items?"]),
               ("s2", ["Mercury is a liquid metal."]), "please reply yes"]
    report = contamination_report([("s", "t", ITEM), ("s", "t", clean), ("s", "t", short)], samples)
    assert (report["items_checked"], report["items_too_short"], report["count"]) == (2, 1, 1)
    hit = report["offending"][0]
    assert (hit["id"], hit["sample"], hit["samples"]) == ("x-1", "s1", 1) and "deliver" in hit["evidence"]


def test_the_rule_comes_from_the_snapshot_manifest():
    manifest = {"config": {"decontam": {"eval_sets": ["e.jsonl"], "ngram": 13, "min_words": 8}}}
    assert rule_of(manifest) == ContaminationRule(ngram=13, min_words=8)
    assert rule_of(None) == ContaminationRule()
    texts = ["Agent notes: after delivery how many days does a customer have to return an item"]
    assert contamination_report([("s", "t", ITEM)], texts, ContaminationRule(ngram=13, min_words=8,
                                fuzzy_containment=1.0, fuzzy_content=1.0))["count"] == 0
    assert contamination_report([("s", "t", ITEM)], texts)["count"] == 1


def leak_records(seed: int, count: int) -> list[dict]:
    """Fragments of real suite items, whole or cut, copy-edited or not, inside chats: some are leaks under the
    rule, some fall just short of it; all survive the trip through the chat template and the tokenizer."""
    rng = random.Random(seed)
    items = [item for _, _, item in suite_items(get_suites("general,business"))]
    records = []
    for _ in range(count):
        item = rng.choice(items)
        texts = [t for t in [*item.get("choices", []), str(item.get("target", ""))] if t.strip()]
        text = item["prompt"] if rng.random() < 0.7 or not any(texts) else rng.choice(texts)
        words = text.split()
        size = rng.randint(min(3, len(words)), len(words)) if rng.random() < 0.3 else len(words) * 2 // 3 + 1
        start = rng.randint(0, len(words) - size)
        piece = words[start : start + size]
        if rng.random() < 0.4 and len(piece) > 4:
            piece[rng.randrange(len(piece))] = rng.choice(["really", "the", "our", "Northwind"])
        if rng.random() < 0.3:
            piece = [w.upper() if rng.random() < 0.5 else w.strip("?.,!") for w in piece]
        fragment = " ".join(piece)
        user, answer = f"Hello, a question from a customer: {fragment}", "Thanks, let me look at that for you."
        if rng.random() < 0.5:
            user, answer = "Can you help me with something?", f"Sure. Our notes say: {fragment} Anything else?"
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        if rng.random() < 0.2:
            messages.insert(0, {"role": "system", "content": f"Context for the agent: {fragment}"})
        records.append({"messages": messages, "domain": "general"})
    return records


def test_a_snapshot_that_passed_decontamination_never_reports_a_contaminated_item(tiny_model, mlops_home, tmp_path):
    suites = get_suites("general,business")
    records = leak_records(seed=5, count=160)
    eval_sets = [str(SUITES_DIR / "**" / "*.jsonl")]

    def report_for(result):
        model = ResolvedModel("x", Path(tiny_model["path"]), "folder",
                              run_tags={"mlops.data_snapshot_id": result.snapshot_id})
        return contamination_for_model(model, suites, ContaminationConfig())

    common = {"workdir": tmp_path, "validation_fraction": 0.0, "seq_len": 512, "dedup": {"near": False}}
    clean = quick_build(records, base_model=tiny_model["path"], decontam={"eval_sets": eval_sets}, **common)
    dropped = clean.manifest["counters"].get("decontam.eval_overlap", 0)
    assert 20 < dropped < len(records) - 20  # both sides of the rule are exercised
    report = report_for(clean)
    assert report["status"] == "checked" and report["count"] == 0, report["offending"][:3]
    assert all(report["suites_covered"].values())

    unchecked = quick_build(records, base_model=tiny_model["path"], name="plain.jsonl", **common)
    control = report_for(unchecked)
    named = {hit["eval_id"] for hit in clean.manifest["decontam"]["examples"]}
    assert control["count"] > 0 and named <= {o["id"] for o in control["offending"]}
    assert not any(control["suites_covered"].values())


def test_model_lineage_snapshot_is_decoded_and_checked(tiny_model, mlops_home):
    from transformers import AutoTokenizer

    from mlops.data.format import write_snapshot

    tok = AutoTokenizer.from_pretrained(tiny_model["path"])
    business = get_suites("business")[0]
    leaked = business.task("biz_billing_mc").items()[3]
    text = tok.apply_chat_template([{"role": "user", "content": leaked["prompt"]},
                                    {"role": "assistant", "content": "Let me check."}], tokenize=False)
    other = "User: my router blinks orange\nAssistant: unplug it for thirty seconds and plug it back in."
    folder = write_snapshot({"train": [tok(text).input_ids, tok(other).input_ids]}, seq_len=128)
    model = ResolvedModel("x", Path(tiny_model["path"]), "folder", run_tags={"mlops.data_snapshot_id": folder.name})
    report = contamination_for_model(model, [business], ContaminationConfig())
    assert report["status"] == "checked" and report["snapshot_id"] == folder.name
    assert [o["id"] for o in report["offending"]] == [leaked["id"]]
    assert report["items_checked"] + report["items_too_short"] == sum(len(t.items()) for t in business.tasks)


def test_model_without_snapshot_lineage_is_reported_as_unknown(tiny_model, mlops_home):
    model = ResolvedModel("x", Path(tiny_model["path"]), "folder")
    assert contamination_for_model(model, get_suites("general"), ContaminationConfig())["status"] == "no_snapshot"
    model = ResolvedModel("x", Path(tiny_model["path"]), "folder", run_tags={"mlops.data_snapshot_id": "snap-nope"})
    assert contamination_for_model(model, get_suites("general"), ContaminationConfig())["status"] == "snapshot_missing"


def _leaky_version(tiny_model, tmp_path, leaked: dict) -> str:
    """A registered version of the tiny model whose lineage names a snapshot that holds one eval prompt."""
    import shutil

    from transformers import AutoTokenizer

    from mlops.data.format import write_snapshot
    from mlops.lineage import Tag
    from mlops.tracking import tracked_run
    from registry.versions import register_model_version

    tok = AutoTokenizer.from_pretrained(tiny_model["path"])
    text = tok.apply_chat_template([{"role": "user", "content": leaked["prompt"]},
                                    {"role": "assistant", "content": "Let me check."}], tokenize=False)
    snapshot = write_snapshot({"train": [tok(text).input_ids]}, seq_len=128).name
    folder = tmp_path / "leaky-model"
    shutil.copytree(tiny_model["path"], folder)
    with tracked_run("test", run_name="train", tags={Tag.STAGE: "train", Tag.BASE_MODEL: "tiny",
                                                     Tag.SNAPSHOT_ID: snapshot}) as run:
        run.log_hf_model(folder)
    return str(register_model_version(run.run_id, "bot"))


def test_a_contaminated_model_is_not_served_and_its_gate_fails_on_the_contamination_alone(
        tiny_model, mlops_home, tmp_path, monkeypatch):
    import evaluation.runner as runner
    from evaluation.gate_run import run_gate
    from mlops.config import load_config
    from mlops.lineage import Tag
    from mlops.run_store import get_run

    leaked = get_suites("general")[0].task("general_knowledge").items()[0]
    version = _leaky_version(tiny_model, tmp_path, leaked)

    def no_server(*args, **kwargs):
        raise AssertionError("a contaminated model was served")

    monkeypatch.setattr(runner, "ServerProcess", no_server)
    cfg = load_config(None, ["eval.limit=2", "run.experiment=eval-test", "eval.suites=[general]"])
    outcome = runner.run_eval(cfg, f"models:/bot/{version}", suites="general")
    assert outcome.scores == [] and outcome.contamination["count"] == 1
    assert outcome.summary["not_scored"].startswith("1 eval items overlap the training snapshot")
    assert leaked["id"] in outcome.summary["not_scored"] and "when_found=score" in outcome.summary["not_scored"]
    assert get_run(outcome.run_id).data.tags[Tag.EVAL_NOT_SCORED] == "contaminated"
    # The gate needs no reference eval and no champion's: the contamination check alone fails it.
    gate = run_gate(cfg, f"models:/bot/{version}", None)
    assert not gate.report.passed and [c.rule for c in gate.report.checks] == ["contamination"]
    assert "1 eval items overlap the training snapshot" in gate.report.reasons[0]


def test_a_released_version_is_scored_despite_contamination_as_the_baseline_it_is(tiny_model):
    from evaluation.runner import not_scored_because, released_version

    report = {"status": "checked", "count": 2, "snapshot_id": "snap-x", "offending": [{"id": "a"}, {"id": "b"}]}
    rule = ContaminationConfig()
    champion = ResolvedModel("models:/bot/1", Path(tiny_model["path"]), "registry", aliases=("production",))
    candidate = ResolvedModel("models:/bot/2", Path(tiny_model["path"]), "registry")
    assert released_version(champion) and not released_version(candidate)
    assert not_scored_because(report, rule, released=released_version(champion)) is None
    assert not_scored_because(report, rule, released=released_version(candidate)).startswith("2 eval items overlap")


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_a_contaminated_model_scored_anyway_still_fails_its_gate_on_contamination(tiny_model, mlops_home, tmp_path):
    from evaluation.gate_run import run_gate
    from evaluation.runner import run_eval
    from mlops.config import load_config

    leaked = get_suites("general")[0].task("general_knowledge").items()[0]
    version = _leaky_version(tiny_model, tmp_path, leaked)
    cfg = load_config(None, ["eval.limit=2", "eval.concurrency=2", "run.experiment=eval-test", "eval.suites=[general]",
                             "eval.contamination.when_found=score", "eval.gate.floors={}", "eval.gate.must_beat={}"])
    outcome = run_eval(cfg, f"models:/bot/{version}", suites="general")
    assert outcome.scores and "not_scored" not in outcome.summary
    assert outcome.summary["contamination"]["count"] == 1
    gate = run_gate(cfg, f"models:/bot/{version}", None)
    assert not gate.report.passed and gate.report.reasons == [gate.report.checks[0].reason]
    assert gate.report.checks[0].rule == "contamination"
