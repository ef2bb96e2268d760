"""The loop back on real stores: logged requests and feedback -> reviewed increment -> accepted source -> snapshot
mixed with history, deduplicated against it, whose manifest names the requests and feedback it came from."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from mlops.data.harvest import HarvestError
from mlops.data.sample import Gen

SINCE = "2026-01-01T00:00:00Z"


def support(n: int, seed: int) -> list[dict]:
    g = Gen(seed)
    return [g.support() for _ in range(n)]


def log_served(records: list[dict], *, prefix: str, ts: float, shadow: bool = False) -> list[str]:
    """Each record's user turn as a served request of `bot` v1, answered with a poor reply."""
    from mlops.requestlog import LoggedRequest, write_requests

    rows = [LoggedRequest(f"{prefix}-{i}", "bot", "1", "/v1/chat/completions",
                          [m for m in r["messages"] if m["role"] != "assistant"], "Sorry, I cannot help with that.",
                          role="shadow" if shadow else "user", ts=ts + i) for i, r in enumerate(records)]
    write_requests(rows)
    return [r.request_id for r in rows]


def feedback(request_id: str, rating: int, correction: str | None = None, ts: float | None = None) -> str:
    from mlops.requestlog import Feedback, write_feedback

    item = Feedback(request_id, rating, correction, source="agent-7", **({"ts": ts} if ts else {}))
    write_feedback(item)
    return item.feedback_id


def rows_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "increment.jsonl").read_text().splitlines()]


def write_rows(folder: Path, rows: list[dict]) -> None:
    (folder / "increment.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def served(traced_home):
    """Requests with every kind of feedback: corrections, bare thumbs-down, thumbs-up, old, and on a shadow."""
    now = time.time()
    records = support(6, seed=3)
    ids = log_served(records, prefix="req", ts=now - 100)
    shadow = log_served(records[:1], prefix="shadow", ts=now - 100, shadow=True)
    fb = {"corrected": feedback(ids[0], -1, records[0]["messages"][-1]["content"]),
          "down": feedback(ids[1], -1),
          "up": feedback(ids[2], 1),
          "agent": feedback(ids[3], 1, records[3]["messages"][-1]["content"]),
          "old": feedback(ids[4], -1, "an old correction", ts=now - 10 * 365 * 86400),
          "shadow": feedback(shadow[0], -1, "not shown to anyone")}
    return {"ids": ids, "records": records, "feedback": fb}


def test_harvest_collects_negative_feedback_and_corrections_for_review_and_keeps_reviews_on_rerun(served, tmp_path):
    from mlops.data.harvest import harvest, review

    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    out = tmp_path / "round3"
    summary = harvest(since, out)
    rows = rows_of(out)
    ids = served["ids"]
    assert [r["request_id"] for r in rows] == [ids[0], ids[1], ids[3]] and summary["pending"] == 3
    first = rows[0]
    assert first["answer"] == "Sorry, I cannot help with that." and first["rating"] == -1 and first["accepted"] is None
    assert first["correction"] == served["records"][0]["messages"][-1]["content"]
    assert first["feedback_ids"] == [served["feedback"]["corrected"]] and rows[1]["correction"] is None
    assert first["messages"][-1]["role"] == "user"

    review(out, ids[0], True, note="right answer")
    later = feedback(ids[2], -1, "A better answer from the agent on the second look.")  # thumbs up turned down
    again = harvest(since, out)
    assert again["added"] == 1 and again["rows"] == 4
    kept = {r["request_id"]: r for r in rows_of(out)}
    assert kept[ids[0]]["accepted"] is True and kept[ids[0]]["note"] == "right answer"
    assert kept[ids[2]]["feedback_ids"] == [served["feedback"]["up"], later]


def test_accept_refuses_an_accepted_row_without_a_correction_and_writes_nothing(served, tmp_path):
    from mlops.data.harvest import accept, harvest

    out = tmp_path / "round3"
    harvest(SINCE, out)
    rows = rows_of(out)
    for row in rows:
        row["accepted"] = True
    write_rows(out, rows)
    with pytest.raises(HarvestError, match=r"line 2: request req-1 is accepted but has no correction"):
        accept(out)
    assert not (out / "accepted.jsonl").exists()
    rows[1]["accepted"] = "yes"
    write_rows(out, rows)
    with pytest.raises(HarvestError, match=r"line 2: accepted='yes'; it must be true, false or null"):
        accept(out)


def test_harvest_to_snapshot_mixes_history_dedups_and_names_its_requests_and_feedback(mlops_home, tiny_model,
                                                                                       tmp_path, monkeypatch):
    """The CLI path: harvest, a person edits the JSONL, accept --build with the history snapshot."""
    from typer.testing import CliRunner

    from mlops.data.cli import app
    from mlops.data.testing import quick_build

    old_records = support(40, seed=1)
    old = quick_build(old_records, base_model=tiny_model["path"], workdir=tmp_path, name="old.jsonl")
    new_records = support(16, seed=2) + old_records[:1]  # the last correction is already in the history snapshot
    ids = log_served(new_records, prefix="live", ts=time.time() - 50)
    fb_ids = [feedback(rid, -1, r["messages"][-1]["content"]) for rid, r in zip(ids, new_records, strict=True)]

    runner = CliRunner()
    out = tmp_path / "round3"
    result = runner.invoke(app, ["harvest", "--since", SINCE, "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    for i, row in enumerate(rows):
        row["accepted"] = i != 0  # the reviewer rejects the first one
    write_rows(out, rows)

    config = tmp_path / "data.yaml"
    config.write_text(yaml.safe_dump({"base_model": str(tiny_model["path"]), "run": {"experiment": "harvest"},
                                      "data": {"sources": [{"path": "replaced.jsonl"}], "batch_size": 16,
                                               "seq_len": 256, "workers": 1, "validation_fraction": 0.1}}))
    result = runner.invoke(app, ["harvest", "accept", str(out), "--build", "--config", str(config),
                                 "--history", old.snapshot_id, "--domain", "support"])
    assert result.exit_code == 0, result.output
    assert "16 accepted (1 rejected, 0 pending)" in result.output

    accepted = [json.loads(line) for line in (out / "accepted.jsonl").read_text().splitlines()]
    assert accepted[0]["messages"][-1] == {"role": "assistant", "content": new_records[1]["messages"][-1]["content"]}
    from mlops.data.snapshot import list_snapshots

    manifest = next(m for m in list_snapshots() if m["snapshot_id"] != old.snapshot_id)
    source = manifest["sources"][0]
    assert source["provenance"] == {"kind": "harvest", "requests": ids[1:], "feedback": fb_ids[1:]}
    assert manifest["counters"]["dedup.exact_of_snapshot"] == 1
    history = manifest["mixing"]["history"]
    new_train = manifest["counts"]["samples"]["train"] - history["samples"]
    assert history["snapshot"] == old.snapshot_id and history["target_ratio"] == 0.3
    assert history["samples"] == round(new_train * 0.3 / 0.7) > 0


def test_an_increment_keeps_the_natural_domain_mix_of_what_users_corrected(tmp_path):
    """The corpus config's domain targets (general 20%, domain 45%, ...) cannot hold for a handful of
    corrections: the increment's config mixes them as they come, history and all else kept."""
    from mlops.config import load_config
    from mlops.data.harvest import ACCEPTED, increment_config
    from tests.conftest import REPO

    (tmp_path / ACCEPTED).write_text("{}\n")
    cfg = load_config(REPO / "configs" / "data" / "sample.yaml", [])
    assert cfg.data.mix.ratios  # the corpus's own targets
    inc = increment_config(cfg, tmp_path, history="snap-0123456789abcdef", ratio=0.3)
    assert inc.data.mix.ratios == {} and inc.data.mix.history.snapshot == "snap-0123456789abcdef"
    assert [s.path for s in inc.data.sources] == [str((tmp_path / ACCEPTED).resolve())]
    assert inc.data.dedup == cfg.data.dedup and inc.data.decontam == cfg.data.decontam
