"""`make demo-dpo`'s scripted review: the held-out pairs never share a question with the trained ones, the split does
not depend on the harvest's order, and a round trains on however few pairs its build kept."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import demo_dpo  # noqa: E402


def _pairs(questions: list[str]) -> list[dict]:
    return [{"pair_id": f"correction:{i}", "messages": [{"role": "user", "content": q}], "chosen": f"fix {i}",
             "rejected": f"bad {i}"} for i, q in enumerate(questions)]


def _review(tmp_path: Path, rows: list[dict], *, unusable: tuple[int, ...] = ()
            ) -> tuple[dict[str, bool], list[str], tuple[int, int]]:
    path = tmp_path / "inc" / "pairs.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = {int(r["pair_id"].rpartition(":")[2]): demo_dpo.pair_id(r) for r in rows}
    counts = demo_dpo.review_and_hold_out(path, tmp_path / "held", usable={ids[i] for i in ids if i not in unusable})
    trained = {json.loads(line)["pair_id"]: json.loads(line)["accepted"] for line in path.read_text().splitlines()}
    held = [json.loads(line)["pair_id"] for line in (tmp_path / "held" / "pairs.jsonl").read_text().splitlines()]
    return trained, held, counts


QUESTIONS = ["How do I return boots?", "Is Plus worth it?", "how do I  return BOOTS?", "Where is my parcel?",
             "Can I order from Japan?", "Is Plus worth it?", "What size am I?",
             "Hi there, long time customer here. What is the difference between wool socks and cotton socks?",
             "Hello there. What is the difference between wool socks and cotton socks? I have never owned any."]


def test_the_demo_review_holds_out_every_pair_of_a_question_and_trains_on_none_of_them(tmp_path):
    trained, held, (n_trained, n_held) = _review(tmp_path, _pairs(QUESTIONS))
    by_id = {f"correction:{i}": demo_dpo.question(r) for i, r in enumerate(_pairs(QUESTIONS))}
    held_questions = {by_id[h] for h in held}
    trained_questions = {by_id[i] for i, accepted in trained.items() if accepted}
    assert held_questions and trained_questions and not held_questions & trained_questions
    assert all(not trained[h] for h in held)  # held out of the training increment, into its own
    assert (n_trained, n_held) == (len(QUESTIONS) - len(held), len(held))
    # a question asked twice, case and spacing aside, is one question
    assert demo_dpo.question(_pairs(["How do I return boots?"])[0]) == demo_dpo.question(
        _pairs(["how do I  return BOOTS?"])[0])


def test_the_demo_review_keeps_a_question_asked_in_other_words_on_one_side(tmp_path):
    rows = _pairs(QUESTIONS)
    groups = demo_dpo.related(rows)
    assert groups[7] == groups[8]  # the same question behind another greeting: the eval's contamination rule
    assert len(set(groups)) == 6  # boots, Plus, parcel, Japan, size, socks
    trained, held, _ = _review(tmp_path, rows)
    assert trained["correction:7"] == trained["correction:8"]


def test_the_demo_review_split_does_not_depend_on_the_harvest_order(tmp_path):
    rows = _pairs(QUESTIONS)
    _, held, _ = _review(tmp_path / "a", rows)
    shuffled = rows[:]
    random.Random(7).shuffle(shuffled)
    _, held_again, _ = _review(tmp_path / "b", shuffled)
    assert sorted(held) == sorted(held_again)


def test_the_demo_review_never_holds_out_a_question_whose_pairs_the_build_sets_aside(tmp_path):
    rows = _pairs(QUESTIONS)
    # the build sets aside 0 and 2 (one question) and 3; 1 and 5 ask the same, and 5 survives
    _, held, (_, n_held) = _review(tmp_path, rows, unusable=(0, 2, 3, 1, 7, 8))
    held_questions = {demo_dpo.question(rows[int(h.rpartition(":")[2])]) for h in held}
    assert n_held and not held_questions & {demo_dpo.question(rows[i]) for i in (0, 2, 3)}


def test_the_demo_stops_naming_the_fix_when_no_question_can_be_held_out(tmp_path):
    with pytest.raises(SystemExit, match="none of the 9 harvested pairs can be held out.*Fix: collect more"):
        _review(tmp_path, _pairs(QUESTIONS), unusable=tuple(range(9)))


@pytest.mark.parametrize("recipe", ["configs/train/tiny.yaml", "configs/train/sft-smollm2-lora.yaml"])
def test_a_dpo_round_trains_one_pair_a_micro_step_at_the_recipes_pairs_per_step(recipe):
    from mlops.config import load_config

    cfg = load_config(REPO / recipe, demo_dpo.pairs_per_step(str(REPO / recipe))).train
    base = load_config(REPO / recipe, []).train
    assert cfg.batch_layout(1) == (1, base.micro_batch_size * base.grad_accum, base.batch_layout(1)[2])
