"""A snapshot's human review read by id (the app's pages and the release report know only the id): unknown when
this store does not hold the snapshot, else the stored counts and bad reasons; the release report prints it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlops.data.review import describe_review, draw, mark_required, snapshot_review, store


@pytest.fixture
def snapshot(mlops_home, tiny_model) -> Path:
    from tokenizers import Tokenizer

    from mlops.data.format import write_snapshot

    tk = Tokenizer.from_file(str(Path(tiny_model["path"]) / "tokenizer.json"))
    samples = [{"id": f"s{i}", "domain": ("billing", "general")[i % 2],
                "input_ids": tk.encode(f"user: question {i}\nassistant: answer {i}").ids} for i in range(6)]
    return write_snapshot({"train": samples}, seq_len=64, extra={"base_model_ref": tiny_model["path"]})


def judged(snapshot: Path, tmp_path: Path, verdicts: list[tuple[str, str]]) -> dict:
    path, items = draw(snapshot, len(verdicts), seed=7, out=tmp_path / "sample.jsonl")
    rows = [{**item, "verdict": v, "reason": r} for item, (v, r) in zip(items, verdicts, strict=True)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return store(snapshot, path, reviewer="ada")


def test_a_snapshot_this_store_does_not_hold_has_an_unknown_review(mlops_home):
    review = snapshot_review("snap-elsewhere")
    assert (review["found"], review["status"]) == (False, None)
    assert describe_review(review) == ("unknown: snapshot snap-elsewhere is not in this project's snapshot store")
    assert "(none recorded)" in describe_review(snapshot_review(None))


def test_a_stored_review_is_read_by_snapshot_id_with_counts_and_bad_reasons(snapshot, tmp_path):
    assert describe_review(snapshot_review(snapshot.name)) == "none"
    judged(snapshot, tmp_path, [("ok", ""), ("bad", "wrong refund window"), ("ok", ""), ("bad", "wrong refund window")])
    mark_required(snapshot)
    review = snapshot_review(snapshot.name[:12])  # a unique prefix, as the CLI accepts
    assert review["found"] and review["required"] and review["snapshot_id"] == snapshot.name
    line = describe_review(review)
    assert line.startswith("4/4 judged (complete) (required before training): 2 ok, 2 bad (50.0%); bad: wrong "
                           "refund window 2; by ada at ")


def test_the_release_report_prints_each_versions_data_review_on_one_line(snapshot, tmp_path):
    from registry.report import render

    judged(snapshot, tmp_path, [("bad", "leaks a name\nv9 production: forged line"), ("ok", "")])
    version = {"version": "1", "stage": "candidate", "stage_reason": None, "aliases": [], "trainer": "ada",
               "registered_by": "ada", "content_id": "mc-1", "run_id": "r1", "snapshot_id": snapshot.name,
               "data_run_id": "d1", "gate": None, "blocking": [], "data_review": snapshot_review(snapshot.name)}
    text = render({"model": "bot", "created": "t", "aliases": {}, "pending": [], "ledger_verified": True,
                   "versions": [version], "ledger": [], "serving": []})
    review_lines = [line for line in text.splitlines() if "data review:" in line]
    assert len(review_lines) == 1
    assert review_lines[0].strip().startswith("data review: 2/2 judged (complete): 1 ok, 1 bad (50.0%); bad: leaks")
    assert not any(line.startswith("v9 production") for line in text.splitlines())
