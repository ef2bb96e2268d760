"""Contamination: eval items against the training snapshot named by the model's lineage."""

from __future__ import annotations

from pathlib import Path

from evaluation.config import ContaminationConfig
from evaluation.contamination import contamination_for_model, contamination_report
from evaluation.suites import get_suites
from mlops.model_refs import ResolvedModel

ITEM = {"id": "x-1", "prompt": "How many days after delivery does a customer have to return an item?",
        "choices": ["14 days", "30 days", "60 days", "90 days"], "answer": 1}


def test_an_item_sharing_an_ngram_with_training_text_is_reported():
    clean = {"id": "x-2", "prompt": "Which metal is liquid at room temperature?", "target": "Mercury"}
    short = {"id": "x-3", "prompt": "Reply yes.", "target": "yes"}
    texts = ["Agent: customers ask how many days after delivery does a customer have to return an item and we say"]
    report = contamination_report([("s", "t", ITEM), ("s", "t", clean), ("s", "t", short)], texts, ngram=8)
    assert report["items_checked"] == 3 and report["count"] == 1
    assert report["offending"][0]["id"] == "x-1" and 0 < report["offending"][0]["ratio"] < 1


def test_min_ratio_and_short_items_compare_whole():
    texts = ["please reply yes or no", "a distant sentence about how many days"]
    short = {"id": "s-1", "prompt": "Reply yes", "target": ""}
    assert contamination_report([("s", "t", short)], texts, ngram=8)["count"] == 1
    report = contamination_report([("s", "t", ITEM)], [ITEM["prompt"][:40]], ngram=3, min_ratio=0.5)
    assert report["count"] == 0  # a few shared 3-grams, under half the item's


def test_model_lineage_snapshot_is_decoded_and_checked(tiny_model, mlops_home):
    from transformers import AutoTokenizer

    from mlops.data.format import write_snapshot

    tok = AutoTokenizer.from_pretrained(tiny_model["path"])
    business = get_suites("business")[0]
    leaked = business.task("biz_billing_mc").items()[3]
    text = f"User: {leaked['prompt']}\nAssistant: {leaked['choices'][leaked['answer']]}"
    other = "User: my router blinks orange\nAssistant: unplug it for thirty seconds and plug it back in."
    folder = write_snapshot({"train": [tok(text).input_ids, tok(other).input_ids]}, seq_len=128)
    model = ResolvedModel("x", Path(tiny_model["path"]), "folder", run_tags={"mlops.data_snapshot_id": folder.name})
    report = contamination_for_model(model, [business], ContaminationConfig())
    assert report["status"] == "checked" and report["snapshot_id"] == folder.name
    assert [o["id"] for o in report["offending"]] == [leaked["id"]]
    assert report["items_checked"] == sum(len(t.items()) for t in business.tasks)


def test_model_without_snapshot_lineage_is_reported_as_unknown(tiny_model, mlops_home):
    model = ResolvedModel("x", Path(tiny_model["path"]), "folder")
    assert contamination_for_model(model, get_suites("general"), ContaminationConfig())["status"] == "no_snapshot"
    model = ResolvedModel("x", Path(tiny_model["path"]), "folder", run_tags={"mlops.data_snapshot_id": "snap-nope"})
    assert contamination_for_model(model, get_suites("general"), ContaminationConfig())["status"] == "snapshot_missing"
