"""Human review of kept records: a seeded, domain-stratified sample as JSONL (redacted as stored), verdicts
stored beside the snapshot, a review file of another snapshot refused, and training refusing a snapshot that
requires a completed review."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from mlops.data.cli import app
from mlops.data.labelled_dedup import conversations
from mlops.data.review import ReviewError, ReviewRequired, allot, draw, review_line, store
from mlops.data.snapshot import verify_snapshot
from mlops.data.testing import chat, quick_build


def test_allotment_is_proportional_with_every_domain_represented():
    assert allot({"a": 90, "b": 9, "c": 1}, 10) == {"a": 8, "b": 1, "c": 1}
    assert allot({"a": 3, "b": 1}, 200) == {"a": 3, "b": 1}  # never more than a domain holds
    assert sum(allot({"a": 50, "b": 30, "c": 20}, 7).values()) == 7


@pytest.fixture
def snapshot(tiny_model, tmp_path, mlops_home):
    def run(**data):
        rows = [{**row, "domain": ("billing", "general", "safety")[i % 3]}
                for i, row in enumerate(conversations(45, seed=6))]
        rows.append(chat("Please send the invoice to jane.doe@example.com as soon as you can.",
                         "Done, I have sent the invoice to that address just now."))
        return quick_build(rows, base_model=tiny_model["path"], workdir=tmp_path, **data)

    return run


def filled(path, bad: int = 1) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for i, row in enumerate(rows):
        row["verdict"], row["reason"] = ("bad", "answer is vague") if i < bad else ("ok", "")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_a_seeded_stratified_sample_is_drawn_as_stored_and_the_same_seed_draws_the_same(snapshot, tmp_path):
    built = snapshot()
    path, items = draw(built.path, 9, seed=7, out=tmp_path / "a.jsonl")
    assert Counter(i["domain"] for i in items) == {"billing": 3, "general": 3, "safety": 3}
    assert [json.loads(x)["sample_id"] for x in path.read_text().splitlines()] == [i["sample_id"] for i in items]
    assert all(i["snapshot_id"] == built.snapshot_id and i["verdict"] == "" for i in items)
    assert all(i["trained_on"] and i["trained_on"] in i["text"] for i in items)
    _, again = draw(built.path, 9, seed=7, out=tmp_path / "b.jsonl")
    _, other = draw(built.path, 9, seed=8, out=tmp_path / "c.jsonl")
    assert [i["sample_id"] for i in again] == [i["sample_id"] for i in items] != [i["sample_id"] for i in other]
    _, everything = draw(built.path, 500, seed=7, out=tmp_path / "all.jsonl")
    text = " ".join(i["text"] for i in everything)
    assert "jane.doe@example.com" not in text and "[EMAIL]" in text  # redacted as stored
    verify_snapshot(built.snapshot_id)  # the review lives beside the snapshot, whose files stay as they were


def test_verdicts_are_stored_and_a_review_of_another_snapshot_is_refused(snapshot, tmp_path):
    built = snapshot()
    path, _ = draw(built.path, 6, seed=7)
    filled(path)
    summary = store(built.path, path, reviewer="grace")
    assert summary["complete"] and summary["ok"] == 5 and summary["bad"] == 1
    assert summary["bad_reasons"] == {"answer is vague": 1}
    assert "6/6 judged (complete)" in review_line(built.path, built.manifest)

    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(path.read_text().replace(built.snapshot_id, "snap-0000000000000000"))
    with pytest.raises(ReviewError) as err:
        store(built.path, foreign)
    assert "snap-0000000000000000" in str(err.value) and built.snapshot_id in str(err.value)
    assert "Fix:" in str(err.value)

    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[2]["verdict"], rows[2]["reason"] = "bad", ""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ReviewError, match="verdict 'bad' and reason ''"):
        store(built.path, path)


def test_training_refuses_a_snapshot_that_requires_a_review_until_one_is_complete(snapshot):
    from training.data_loader import open_snapshot

    built = snapshot(accept={"on_fail": "flag", "require_review": True})
    with pytest.raises(ReviewRequired, match=f"snapshot {built.snapshot_id} requires a completed human review"):
        open_snapshot(built.snapshot_id)
    path, _ = draw(built.path, 6, seed=7)
    rows = filled(path)
    partial = path.with_name("partial.jsonl")
    partial.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))  # two samples without a verdict
    store(built.path, partial)
    with pytest.raises(ReviewRequired, match="misses 2 of 6 verdicts"):
        open_snapshot(built.snapshot_id)
    store(built.path, path)
    folder, manifest = open_snapshot(built.snapshot_id)
    assert folder == built.path


def test_the_requirement_holds_for_a_snapshot_found_again(snapshot):
    from training.data_loader import open_snapshot

    plain = snapshot()
    open_snapshot(plain.snapshot_id)
    again = snapshot(accept={"on_fail": "flag", "require_review": True})
    assert again.noop and again.snapshot_id == plain.snapshot_id  # the accept section is no part of the id
    with pytest.raises(ReviewRequired):
        open_snapshot(plain.snapshot_id)


def test_the_cli_draws_and_stores_and_refuses_both_or_neither(snapshot, mlops_home):
    built = snapshot()
    runner = CliRunner()
    drawn = runner.invoke(app, ["review", built.snapshot_id, "--n", "4"])
    assert drawn.exit_code == 0, drawn.output
    assert f"4 samples of {built.snapshot_id}" in drawn.output
    path = built.path.parent / ".reviews" / built.snapshot_id / "sample.jsonl"
    filled(path, bad=0)
    stored = runner.invoke(app, ["review", built.snapshot_id, "--verdicts", str(path)])
    assert stored.exit_code == 0 and "4/4 judged, 4 ok, 0 bad; complete" in stored.output
    shown = runner.invoke(app, ["show", built.snapshot_id])
    assert "review     4/4 judged (complete)" in shown.output and "acceptance" in shown.output
    neither = runner.invoke(app, ["review", built.snapshot_id])
    assert neither.exit_code != 0 and "exactly one of --n" in str(neither.exception)
