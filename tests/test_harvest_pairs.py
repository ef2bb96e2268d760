"""Preference pairs from production (`mlops data harvest --pairs`): corrections, spot-check verdicts and rated shadow
answers become candidate pairs that name where they came from, a person reviews them as the chat harvest is
reviewed, and the accepted ones build a preference snapshot whose rows carry their provenance."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest
import yaml

from mlops.data.harvest import HarvestError
from mlops.data.sample import Gen

REPO = Path(__file__).resolve().parent.parent
SINCE = "2026-01-01T00:00:00Z"
SERVED = "Sorry, I cannot help with that."


def support(n: int, seed: int) -> list[dict]:
    g = Gen(seed)
    return [g.support() for _ in range(n)]


def prompt_of(record: dict) -> list[dict]:
    return [m for m in record["messages"] if m["role"] != "assistant"]


def log(records: list[dict], *, prefix: str, shadow_answers: dict[int, str] | None = None) -> list[str]:
    """Each record's prompt served by `bot` v1 with a poor reply; shadow answers by v2 for the given indexes."""
    from mlops.requestlog import LoggedRequest, write_requests

    now = time.time() - 100
    rows = [LoggedRequest(f"{prefix}-{i}", "bot", "1", "/v1/chat/completions", prompt_of(r), SERVED, ts=now + i)
            for i, r in enumerate(records)]
    rows += [LoggedRequest(f"{prefix}-{i}:shadow", "bot", "2", "/v1/chat/completions", prompt_of(records[i]), text,
                           role="shadow", parent_id=f"{prefix}-{i}", ts=now + i + 0.5)
             for i, text in (shadow_answers or {}).items()]
    write_requests(rows)
    return [f"{prefix}-{i}" for i in range(len(records))]


def feedback(request_id: str, rating: int, correction: str | None = None) -> str:
    from mlops.requestlog import Feedback, write_feedback

    item = Feedback(request_id, rating, correction, source="agent-7")
    write_feedback(item)
    return item.feedback_id


def spotcheck_export(path: Path, records: list[dict]) -> Path:
    """What `mlops registry spot-check export` prints, with verdicts filled in."""
    answer = [r["messages"][-1]["content"] for r in records]
    item = {"check_id": "sc-1234abcd", "stratum": "served", "reference": None, "choices": ["A", "B", "same"],
            "wrong_fact": [], "note": "", "reviewer": "rita"}
    rows = [
        {**item, "item": 1, "source": "request:live-9", "prompt": prompt_of(records[7]), "answer_a": answer[7],
         "answer_b": SERVED, "preferred": "A"},
        {**item, "item": 2, "source": "suite:business.jsonl#q2", "prompt": prompt_of(records[1]), "answer_a": SERVED,
         "answer_b": answer[1], "preferred": "b"},
        {**item, "item": 3, "prompt": prompt_of(records[2]), "answer_a": answer[2], "answer_b": SERVED,
         "preferred": "same"},
        {**item, "item": 4, "prompt": prompt_of(records[3]), "answer_a": answer[3], "answer_b": None,
         "choices": ["acceptable", "unacceptable"], "preferred": "acceptable"},
        {**item, "item": 5, "prompt": prompt_of(records[4]), "answer_a": answer[4], "answer_b": SERVED,
         "preferred": "A", "wrong_fact": ["A"]},
        {**item, "item": 6, "prompt": prompt_of(records[5]), "answer_a": "[no answer: timeout]", "answer_b": SERVED,
         "preferred": "A"},
        {**item, "item": 7, "prompt": prompt_of(records[6]), "answer_a": answer[6], "answer_b": SERVED,
         "preferred": None},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pairs_of(folder: Path) -> dict[str, dict]:
    return {r["pair_id"]: r for r in map(json.loads, (folder / "pairs.jsonl").read_text().splitlines())}


@pytest.fixture
def production(traced_home, tmp_path):
    """A corrected answer, a thumbs-down with a shadow answer, a thumbs-up with one, a failed shadow, spot-checks."""
    from mlops.requestlog import trace_id_of

    records = support(8, seed=5)
    better = records[1]["messages"][-1]["content"]
    ids = log(records[:4], prefix="live", shadow_answers={1: better, 2: "A shadow answer nobody rated down.",
                                                          3: ""})
    fb = {"corrected": feedback(ids[0], -1, records[0]["messages"][-1]["content"]),
          "down": feedback(ids[1], -1), "up": feedback(ids[2], 1), "down_empty": feedback(ids[3], -1)}
    export = spotcheck_export(tmp_path / "spotcheck.jsonl", records)
    return {"ids": ids, "records": records, "feedback": fb, "export": export, "trace": trace_id_of}


def test_harvest_pairs_from_corrections_spot_checks_and_rated_shadow_answers_names_every_origin(production, tmp_path):
    from mlops.data.harvest_pairs import harvest_pairs

    ids, records, trace = production["ids"], production["records"], production["trace"]
    out = tmp_path / "pairs"
    summary = harvest_pairs(SINCE, out, spotchecks=[production["export"]])
    rows = pairs_of(out)
    assert sorted(rows) == [f"correction:{ids[0]}", "shadow:live-1:shadow", "spotcheck:sc-1234abcd#1",
                            "spotcheck:sc-1234abcd#2"]
    assert summary["by_kind"] == {"correction": 1, "shadow": 1, "spotcheck": 2} and summary["pending"] == 4
    assert summary["dropped"] == {"shadow.no_answer": 1, "spotcheck.no_answer": 1, "spotcheck.preferred_wrong_fact": 1,
                                  "spotcheck.single_answer": 1, "spotcheck.tie": 1, "spotcheck.unjudged": 1}

    correction = rows[f"correction:{ids[0]}"]  # the correction is chosen, the served answer rejected
    assert (correction["chosen"], correction["rejected"]) == (records[0]["messages"][-1]["content"], SERVED)
    assert correction["messages"] == prompt_of(records[0]) and correction["accepted"] is None
    assert correction["provenance"] == {"kind": "correction", "request_id": ids[0], "trace_id": trace(ids[0]),
                                        "feedback_ids": [production["feedback"]["corrected"]]}

    shadow = rows["shadow:live-1:shadow"]  # served answer rated down, the shadow's answer to it not: chosen
    assert (shadow["chosen"], shadow["rejected"]) == (records[1]["messages"][-1]["content"], SERVED)
    assert shadow["provenance"] == {"kind": "shadow", "request_id": ids[1], "trace_id": trace(ids[1]),
                                    "shadow_request_id": "live-1:shadow", "shadow_trace_id": trace("live-1:shadow"),
                                    "shadow_version": "2", "feedback_ids": [production["feedback"]["down"]]}

    first, second = rows["spotcheck:sc-1234abcd#1"], rows["spotcheck:sc-1234abcd#2"]  # the preferred answer wins
    assert (first["chosen"], first["rejected"]) == (records[7]["messages"][-1]["content"], SERVED)
    assert (second["chosen"], second["rejected"]) == (records[1]["messages"][-1]["content"], SERVED)
    assert first["provenance"] == {"kind": "spotcheck", "spotcheck_id": "sc-1234abcd", "item": 1,
                                   "prompt_source": "request:live-9", "request_id": "live-9",
                                   "trace_id": trace("live-9")}
    assert second["provenance"]["prompt_source"] == "suite:business.jsonl#q2" and "request_id" not in \
        second["provenance"]


def test_reviews_survive_a_rerun_and_new_feedback_adds_pairs(production, tmp_path):
    from mlops.data.harvest_pairs import harvest_pairs, review_pair

    out = tmp_path / "pairs"
    harvest_pairs(SINCE, out)
    review_pair(out, "shadow:live-1:shadow", True, note="the shadow's answer is right")
    review_pair(out, f"correction:{production['ids'][0]}", False)
    feedback(production["ids"][2], -1, "Our agent's better answer to this question, written on a second look.")
    again = harvest_pairs(SINCE, out)
    rows = pairs_of(out)
    assert again["added"] == 2 and again["rows"] == 4  # the correction, and the shadow now rated down
    assert rows["shadow:live-1:shadow"]["accepted"] is True
    assert rows["shadow:live-1:shadow"]["note"] == "the shadow's answer is right"
    assert rows[f"correction:{production['ids'][0]}"]["accepted"] is False
    assert rows["shadow:live-2:shadow"]["chosen"] == "A shadow answer nobody rated down."
    with pytest.raises(HarvestError, match="pair 'nope' is not in"):
        review_pair(out, "nope", True)


def test_accept_refuses_a_pair_that_teaches_nothing_and_writes_nothing(production, tmp_path):
    from mlops.data.harvest_pairs import accept_pairs, harvest_pairs, review_pair

    out = tmp_path / "pairs"
    harvest_pairs(None, out, spotchecks=[production["export"]])
    with pytest.raises(HarvestError, match=r"no pair of .* is accepted \(2 pending, 0 rejected\)"):
        accept_pairs(out)
    review_pair(out, "spotcheck:sc-1234abcd#1", True, chosen=SERVED + "  ")
    with pytest.raises(HarvestError, match=r"line 1: pair spotcheck:sc-1234abcd#1 is accepted but its chosen and "
                                           r"rejected answers are the same. Nothing was written"):
        accept_pairs(out)
    review_pair(out, "spotcheck:sc-1234abcd#1", True, chosen=" ")
    with pytest.raises(HarvestError, match="its chosen answer is empty"):
        accept_pairs(out)
    assert not (out / "accepted-pairs.jsonl").exists()


def test_harvest_pairs_to_a_preference_snapshot_whose_rows_name_their_origin(production, tiny_model, tmp_path,
                                                                            monkeypatch):
    """The CLI path: harvest --pairs, a person edits the JSONL, accept --pairs --build."""
    from typer.testing import CliRunner

    from mlops.data.cli import app
    from mlops.data.format import SPLITS, SnapshotReader

    runner = CliRunner()
    out = tmp_path / "pairs"
    result = runner.invoke(app, ["harvest", "--pairs", "--since", SINCE, "--out", str(out),
                                 "--spotchecks", str(production["export"])])
    assert result.exit_code == 0, result.output
    assert "4 pairs to review" in result.output and "accept" in result.output
    rows = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    for row in rows:
        row["accepted"] = row["pair_id"] != "spotcheck:sc-1234abcd#2"  # the reviewer rejects one
    (out / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    config = tmp_path / "data.yaml"
    config.write_text(yaml.safe_dump({"base_model": str(tiny_model["path"]), "run": {"experiment": "harvest"},
                                      "data": {"sources": [{"path": "replaced.jsonl"}], "batch_size": 16,
                                               "seq_len": 256, "workers": 1, "record_type": "preference",
                                               # corrections are long, served refusals short: a lenient gate
                                               "pairs": {"max_length_ratio": 20.0},
                                               "accept": {"on_fail": "flag"}}}))
    result = runner.invoke(app, ["harvest", "accept", str(out), "--pairs", "--build", "--config", str(config),
                                 "--domain", "support"])
    assert result.exit_code == 0, result.output
    assert "3 pairs accepted (correction 1, shadow 1, spotcheck 1; 1 rejected, 0 pending)" in result.output
    provenance = json.loads((out / "accepted-pairs.jsonl.provenance.json").read_text())
    ids = production["ids"]
    assert provenance["requests"] == sorted([ids[0], ids[1], "live-9"])
    assert provenance["spotchecks"] == ["sc-1234abcd#1"]
    assert provenance["feedback"] == [production["feedback"]["corrected"], production["feedback"]["down"]]

    from mlops.data.snapshot import list_snapshots, resolve_snapshot

    manifest = list_snapshots()[0]
    folder = resolve_snapshot(manifest["snapshot_id"])
    assert manifest["record_type"] == "preference" and manifest["pairs"]["total"] == 3
    assert manifest["sources"][0]["provenance"] == provenance  # the manifest names every request and spot-check
    metas = [m for split in SPLITS for m in SnapshotReader(folder, split).iter_meta()]
    origins = {m["provenance"]["pair_id"] for m in metas}
    assert origins == {f"correction:{ids[0]}", "shadow:live-1:shadow", "spotcheck:sc-1234abcd#1"}
    assert all(m["provenance"].get("request_id") for m in metas)


def test_harvest_pairs_cli_refuses_what_would_mix_or_split_pairs(production, tmp_path):
    from typer.testing import CliRunner

    from mlops.data.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["harvest", "--spotchecks", str(production["export"]), "--out", str(tmp_path)])
    assert result.exit_code != 0 and "add --pairs" in str(result.exception)
    result = runner.invoke(app, ["harvest", "accept", str(tmp_path), "--pairs", "--history", "snap-1"])
    assert result.exit_code != 0 and "would split pairs" in str(result.exception)


def test_data_cli_and_harvest_cli_import_top_down():
    """mlops.data.cli registers the harvest commands; mlops.data.harvest_cli imports nothing of it."""
    def imports(name: str) -> set[str]:
        tree = ast.parse((REPO / "mlops" / "data" / f"{name}.py").read_text(encoding="utf-8"))
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}

    assert "mlops.data.cli" not in imports("harvest_cli")
    assert "mlops.data.harvest_cli" in imports("cli")
    from mlops.data.cli import app

    assert "harvest" in [group.name for group in app.registered_groups]
