"""The contamination rule: what normalisation folds, which paraphrased leaks it catches, what it leaves alone."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from mlops.data.config import ContaminationRule, DecontamConfig
from mlops.data.decontam import EvalIndex, leak_words

CASES = json.loads((Path(__file__).parent / "data" / "decontam_cases.json").read_text())


def case_index(rule: ContaminationRule) -> EvalIndex:
    index = EvalIndex(rule)
    for item in CASES["eval_items"]:
        index.add_item(item, {"id": item["id"]})
    return index


def test_normalisation_folds_case_punctuation_contractions_numbers_and_endings():
    assert leak_words("Don't RETURN the twenty-four Boxes; it's thirty days.") == [
        "do", "not", "return", "24", "boxe", "it", "is", "30", "day"]
    assert leak_words("What's the customer's order?") == leak_words("what is customer order")
    assert leak_words("A customer can't wait") == leak_words("the customers cannot wait")
    assert leak_words("ﬁve ＵＳＢ cables") == ["5", "usb", "cable"]  # compatibility forms and full-width letters


def test_paraphrased_leaks_are_caught_and_topical_texts_are_not():
    index = case_index(ContaminationRule())
    caught = [leak for leak in CASES["leaks"] if leak["eval_id"] in {r["id"] for r, _ in index.matches(leak["text"])}]
    assert len(caught) / len(CASES["leaks"]) >= 0.9, [x for x in CASES["leaks"] if x not in caught]
    flagged = [(c["text"], index.matches(c["text"])) for c in CASES["clean"] if index.matches(c["text"])]
    assert flagged == []


def test_a_leak_is_found_per_message_not_across_a_conversation():
    index = case_index(ContaminationRule())
    split = ["How many days after delivery does", "a customer have to return an item?"]
    assert index.find(split) is None  # each half alone is no leak
    assert index.find(" ".join(split))[0]["id"] == "rr-01"
    assert index.find(["hello", " ".join(split)])[0]["id"] == "rr-01"


def test_short_eval_texts_match_whole_and_very_short_ones_never():
    index = EvalIndex(ContaminationRule(min_words=6))
    index.add_item({"id": "x", "prompt": "What is the chemical symbol for gold?", "choices": ["Au", "Ag"]}, {"id": "x"})
    assert index.find("Quiz: what is the chemical symbol for gold, please?")[0]["id"] == "x"
    assert index.find("What is the chemical symbol for silver?") is None  # another question on the same stem
    assert index.find("Au Ag") is None  # answer choices this short are no evidence of a leak


def test_the_index_travels_to_worker_processes_unchanged():
    index = case_index(ContaminationRule())
    copy = pickle.loads(pickle.dumps(index))
    texts = [leak["text"] for leak in CASES["leaks"]] + [c["text"] for c in CASES["clean"]]
    assert [copy.matches(t) for t in texts] == [index.matches(t) for t in texts]


def test_rule_sizes_that_cannot_work_are_refused():
    with pytest.raises(ValidationError, match="min_words"):
        DecontamConfig(ngram=5, min_words=8)
    with pytest.raises(ValidationError, match="fuzzy_shingle"):
        ContaminationRule(min_words=3, fuzzy_shingle=3)
    assert DecontamConfig(eval_sets=["x.jsonl"], ngram=10).rule() == ContaminationRule(ngram=10)
