"""Compare's data: sample-level differences from lm-eval sample records, earlier champions, escaped output."""

from __future__ import annotations

from app.compare import earlier_champions, markdown_table, sample_diff, sample_view, score_rows
from registry.entries import Entry


def mc(doc_id, picked, answer=1, acc=None):
    choices = ["14 days", "30 days", "90 days"]
    return {"doc_id": doc_id, "item_id": f"rr-{doc_id}", "target": answer,
            "arguments": [["Customer question: How long?\nAnswer:", f" {c}"] for c in choices],
            "response": [[-0.5 if i == picked else -3.0, i == picked] for i in range(3)],
            "metrics": {"acc": float(picked == answer) if acc is None else acc}}


def gen(doc_id, text, target="51", score=None):
    return {"doc_id": doc_id, "item_id": f"ar-{doc_id}", "target": target,
            "arguments": [["What is 34 + 17?", {"until": ["\n"]}]], "response": [text],
            "metrics": {"exact_match": float(text == target) if score is None else score}}


def test_a_multiple_choice_sample_shows_the_chosen_and_the_correct_choice():
    view = sample_view(mc(0, picked=2))
    assert view == {"prompt": "Customer question: How long?\nAnswer:", "output": "90 days", "reference": "30 days"}


def test_a_generation_sample_shows_its_text_and_target():
    assert sample_view(gen(0, "51")) == {"prompt": "What is 34 + 17?", "output": "51", "reference": "51"}


def test_sample_diff_finds_newly_failed_and_newly_passed_items_with_both_outputs():
    champion = [gen(0, "51"), gen(1, "50"), gen(2, "51"), gen(3, "7")]
    challenger = [gen(0, "15"), gen(1, "51"), gen(2, "51"), gen(3, "8")]
    diff = sample_diff(champion, challenger, "exact_match")
    assert [r["item"] for r in diff["newly_failed"]] == ["ar-0"]
    assert [r["item"] for r in diff["newly_passed"]] == ["ar-1"]
    failed = diff["newly_failed"][0]
    assert (failed["champion output"], failed["challenger output"], failed["reference"]) == ("51", "15", "51")


def test_sample_diff_uses_a_threshold_for_graded_metrics_and_skips_items_missing_on_one_side():
    champion = [gen(0, "a", score=0.8), gen(1, "b", score=0.2)]
    challenger = [gen(0, "c", score=0.6), gen(1, "d", score=0.7), gen(9, "e", score=0.0)]
    diff = sample_diff(champion, challenger, "exact_match")
    assert diff["newly_failed"] == [] and [r["item"] for r in diff["newly_passed"]] == ["ar-1"]


def test_model_output_in_the_sample_table_is_text_not_markdown():
    table = markdown_table([{"output": "**bold** | <script>x</script> :red[alarm] $x$"}])
    row = table.splitlines()[2]
    assert "\\*\\*bold\\*\\*" in row and "\\|" in row and "\\<script\\>" in row and "\\:red\\[" in row


def test_earlier_champions_come_from_the_ledgers_production_moves_newest_first():
    moves = [Entry(i, "t", "bob", action, "bot", v, alias="production", alias_after=v)
             for i, (action, v) in enumerate([("promote", "1"), ("promote", "2"), ("rollback", "1"),
                                              ("promote", "3"), ("promote", "4")], start=1)]
    assert earlier_champions(moves, {"4", "5"}) == ["3", "1", "2"]


def test_scores_carry_the_interval_the_gate_uses():
    summary = {"tasks": [{"name": "general_knowledge", "suite": "general", "area": "knowledge", "metric": "acc",
                          "value": 0.5, "stderr": 0.1, "n": 20}],
               "areas": [{"name": "billing", "suite": "business", "area": "billing", "metric": "acc+f1",
                          "value": 0.9, "stderr": 0.1, "n": 16, "kind": "area"}]}
    rows = {r["unit"]: r for r in score_rows("v2", summary, z=1.645)}
    assert rows["general_knowledge"]["lo"] == 0.5 - 0.1645 and rows["general_knowledge"]["group"] == "general task"
    assert rows["billing"]["hi"] == 1.0 and rows["billing"]["group"] == "business dimension"  # clipped to [0, 1]
