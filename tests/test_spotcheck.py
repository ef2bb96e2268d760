"""The human spot-check gate on a real embedded store: blind sample, verdicts, ledger, gate, JSONL round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlops.identities import AuthError
from registry.identities import set_policy
from registry.testing import PASSWORDS
from registry.transition import RefusedError


def policy_file(tmp: Path, **spot) -> Path:
    import yaml

    path = tmp / "release.yaml"
    path.write_text(yaml.safe_dump({"registry": {"spot_check": {"required": True, "min_share_same_or_better": 0.8,
                                                                "max_tokens": 4, **spot}}}))
    return path


@pytest.fixture
def reg(mlops_home, tiny_model, tmp_path, monkeypatch):
    """v1 in production, v2 a candidate trained by tina; the release policy requires a spot-check."""
    return _registry(tiny_model, tmp_path, monkeypatch)


@pytest.fixture
def any_reg(store, mlops_home, tiny_model, tmp_path, monkeypatch):
    """`reg` on each store in turn: on PostgreSQL an act that reads the spot-check tables holds a third
    connection (the act lock, the ledger transaction, the read) from its bounded pool."""
    return _registry(tiny_model, tmp_path, monkeypatch)


def _registry(tiny_model, tmp_path, monkeypatch) -> dict:
    from registry.testing import release_version, two_versions

    who, _, versions = two_versions(Path(tiny_model["path"]), tmp=tmp_path)
    release_version(who, "bot", "1")  # the first champion, before the policy asked for spot-checks
    set_policy(who["admin"], policy_file(tmp_path))
    return {"who": who, "versions": versions, "tmp": tmp_path, "tiny": tiny_model, "monkeypatch": monkeypatch}


def fake_answers(ref: str, conversations: list[list[dict]], **_options) -> list[dict]:
    """Answers that say who gave them, so a test can act as a reviewer who recognises the better one."""
    who = "challenger" if ref.endswith("/2") or ref.endswith("/3") else "champion"
    return [{"text": f"{who} answer {i}", "latency_ms": 1.0, "tokens": 3, "error": None}
            for i, _ in enumerate(conversations)]


def new_check(reg, version: str = "2", n: int = 6) -> str:
    from registry.spotcheck import create

    return create(reg["who"]["alice"], "bot", version, n=n, seed=11, answer=fake_answers)["check_id"]


def letter_of(item: dict, who: str) -> str:
    return "A" if item["answer_a"].startswith(who) else "B"


def review(reg, check_id: str, *, worse: int = 0, wrong_fact: tuple[int, ...] = (), note: str = "",
           reviewer: str = "alice") -> dict:
    from registry.spotcheck import blind_items, record_many

    rows = []
    for i, item in enumerate(blind_items(check_id)):
        preferred = letter_of(item, "champion" if i < worse else "challenger")
        bad = [letter_of(item, "challenger")] if item["item"] in wrong_fact else []
        rows.append({"item": item["item"], "preferred": preferred, "wrong_fact": bad,
                     "note": note if bad else ""})
    return record_many(reg["who"][reviewer], check_id, rows)


def gate(version: str = "2"):
    from registry.audit import model_state
    from registry.resolve import release_policy
    from registry.spotcheck import judge

    return judge(model_state("bot"), version, release_policy().spot_check)


def actions() -> list[str]:
    from registry import ledger

    return [e.action for e in ledger.entries("bot")]


def test_spot_check_draws_a_stratified_blind_sample_answered_by_both_served_models(reg):
    """Real answers: both versions served in-process under their deployment profiles, asked over HTTP."""
    from mlops.requestlog import LoggedRequest, write_requests
    from registry import ledger
    from registry.config import SpotCheckPolicy
    from registry.spotcheck import blind_items, create
    from registry.spotcheck_store import items_of

    write_requests([LoggedRequest(f"req-{i}", "bot", "1", "/v1/chat/completions",
                                  [{"role": "user", "content": f"Where is my parcel number {i}?"}], "On its way.")
                    for i in range(3)])
    policy = SpotCheckPolicy(required=True, served_share=0.25, max_tokens=4)
    summary = create(reg["who"]["alice"], "bot", "2", n=9, seed=5, policy=policy)

    assert summary["items"] == 9 and summary["champion_version"] == "1"
    assert summary["strata"].pop("served") == 2  # a quarter of 9, from the request log
    assert len(summary["strata"]) == 7 and set(summary["strata"].values()) == {1}  # every business dimension once
    items = blind_items(summary["check_id"])
    assert all("a_is" not in i and "answers_meta" not in i for i in items)
    assert sum(i["source"].startswith("request:req-") for i in items) == 2
    stored = items_of(summary["check_id"])
    assert {i["a_is"] for i in stored} == {"challenger", "champion"}  # the order differs per item
    for item in stored:
        for side in ("challenger", "champion"):
            assert item["answers_meta"][side]["error"] is None and item["answers_meta"][side]["tokens"] >= 1
    created = [e for e in ledger.entries("bot") if e.action == "spot_check"][-1]
    assert created.actor == "alice" and created.evidence["check_id"] == summary["check_id"]
    assert created.evidence["champion"] == "1" and created.evidence["served_items"] == 2


def test_promotion_needs_a_passed_spot_check_reviewed_blind_by_someone_else(any_reg):
    from registry.audit import model_state
    from registry.release import decide, promote, request
    from registry.testing import gate_evidence

    reg = any_reg
    who = reg["who"]
    gate_evidence("bot", "2", champion=("1", model_state("bot").versions["1"].content_id))
    request(who["tina"], "bot", "2", "production", "ready")
    with pytest.raises(RefusedError, match="spot_check gate failed: no reviewed spot-check of version 2"):
        decide(who["bob"], "bot", "2", "ok", approve=True)

    check_id = new_check(reg)
    half = review(reg, check_id)
    assert half["complete"] and half["tallies"]["better"] == 6 and half["tallies"]["reviewers"] == ["alice"]
    assert actions()[-2:] == ["spot_check", "spot_check_review"]
    decide(who["bob"], "bot", "2", "spot-check passed", approve=True)
    entry = promote(who["bob"], "bot", "2", "production")
    gates = {g["gate"]: g for g in entry.evidence["gates"]}
    assert gates["spot_check"]["passed"] and gates["spot_check"]["evidence"]["check_id"] == check_id


def test_spot_check_fails_below_the_share_and_on_an_unexplained_wrong_fact_until_explained(reg):
    check_id = new_check(reg)
    review(reg, check_id, worse=2)  # 4 of 6 same or better: 67% < 80%
    passed, detail, evidence = gate()
    assert not passed and "67% of 6 items" in detail and evidence["worse"] == 2

    check_id = new_check(reg)
    review(reg, check_id, wrong_fact=(3,))  # 5 of 6 better, one wrong fact without a note
    passed, detail, _ = gate()
    assert not passed and "items [3] mark a wrong fact in the challenger with no note" in detail
    review(reg, check_id, wrong_fact=(3,), note="the policy page changed last week; the suite item is outdated")
    passed, detail, evidence = gate()
    assert passed, detail
    assert evidence["wrong_fact"] == 1 and evidence["share_same_or_better"] == pytest.approx(5 / 6, abs=1e-3)
    assert actions().count("spot_check_review") == 3  # the amendment is ledgered as well


def test_the_trainer_may_not_review_and_a_viewer_may_not_review_at_all(reg):
    from registry.release import register
    from registry.spotcheck import record
    from registry.testing import training_run

    run_id = training_run(Path(reg["tiny"]["path"]), tmp=reg["tmp"], variant=3, trainer="admin")
    version = register(reg["who"]["tina"], run_id, "bot")
    check_id = new_check(reg, version, n=2)
    with pytest.raises(RefusedError, match="'admin' trained or registered version 3"):
        record(reg["who"]["admin"], check_id, 1, "A")
    with pytest.raises(AuthError, match="may not spot check"):
        record(reg["who"]["vic"], check_id, 1, "A")
    from registry.spotcheck_store import current_verdicts

    assert current_verdicts(check_id) == {}


def test_verdicts_changed_outside_the_registry_or_a_new_champion_fail_the_gate(reg):
    import sqlalchemy as sa

    from registry.spotcheck_store import VERDICTS, engine

    check_id = new_check(reg)
    review(reg, check_id)
    assert gate()[0]
    with engine().begin() as conn:
        conn.execute(sa.update(VERDICTS).where(VERDICTS.c.check_id == check_id, VERDICTS.c.item_no == 1)
                     .values(verdict="worse"))
    passed, detail, _ = gate()
    assert not passed and "changed outside the registry" in detail

    check_id = new_check(reg, "2")
    review(reg, check_id)
    assert gate()[0]
    from registry.audit import model_state
    from registry.release import register
    from registry.testing import release_version, training_run

    v3 = register(reg["who"]["tina"], training_run(Path(reg["tiny"]["path"]), tmp=reg["tmp"], variant=3), "bot")
    set_policy(reg["who"]["admin"], policy_file(reg["tmp"], required=False))
    release_version(reg["who"], "bot", v3, champion=("1", model_state("bot").versions["1"].content_id))
    passed, detail, _ = gate()
    assert not passed and "the champion now is v3: it is stale" in detail


def test_jsonl_round_trip_through_the_cli_records_the_reviewers_verdicts(reg, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from registry.cli import app
    from registry.spotcheck import blind_items

    runner = CliRunner()
    monkeypatch.setenv("MLOPS_USER", "alice")
    monkeypatch.setenv("MLOPS_PASSWORD", PASSWORDS["alice"])
    monkeypatch.setattr("serving.spot_answers.served_answers", fake_answers)
    out = runner.invoke(app, ["spot-check", "bot", "2", "--n", "3", "--seed", "4", "--json"])  # create by default
    assert out.exit_code == 0, out.output
    check_id = json.loads(out.output)["check_id"]
    out = runner.invoke(app, ["spot-check", "export", check_id])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert [r["item"] for r in rows] == [1, 2, 3] and all(r["preferred"] is None for r in rows)
    assert "challenger" not in json.dumps([{k: v for k, v in r.items() if not k.startswith("answer")} for r in rows])

    rows[0]["preferred"] = "same"
    rows[1]["preferred"] = letter_of(rows[1], "challenger").lower()
    rows[2].update(preferred=letter_of(rows[2], "champion"), wrong_fact=[letter_of(rows[2], "challenger")],
                   note="says returns take 60 days; policy is 30")
    edited = tmp_path / "items.jsonl"
    edited.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = runner.invoke(app, ["spot-check", "import", str(edited), "--json"])
    assert out.exit_code == 0, out.output
    done = json.loads(out.output)[check_id]
    assert done["imported"] == 3 and done["complete"]
    assert {k: done["tallies"][k] for k in ("better", "same", "worse", "wrong_fact")} == \
        {"better": 1, "same": 1, "worse": 0, "wrong_fact": 1}
    assert {i["reviewer"] for i in blind_items(check_id)} == {"alice"}

    out = runner.invoke(app, ["spot-check", "import", str(edited), "--json"])  # nothing changed: nothing new
    assert json.loads(out.output)[check_id]["imported"] == 0
    rows[0]["preferred"] = "maybe"
    edited.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = runner.invoke(app, ["spot-check", "import", str(edited)])
    assert isinstance(out.exception, RefusedError) and "line 1: item 1: preferred='maybe'" in str(out.exception)
    assert actions().count("spot_check_review") == 1


def test_a_first_release_is_spot_checked_blind_against_the_base_model_it_was_trained_from(mlops_home, tiny_model,
                                                                                          tmp_path, monkeypatch):
    import json as _json

    from mlops.paths import models_dir
    from mlops.tracking import init_experiment
    from registry.audit import model_state
    from registry.release import register
    from registry.resolve import release_policy
    from registry.spotcheck import blind_items, create, judge, record_many, summary
    from registry.testing import make_identities, training_run

    init_experiment("registry-test")
    who = make_identities()
    version = register(who["tina"], training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=1), "solo")
    models_dir().mkdir(parents=True, exist_ok=True)  # this machine holds the base model the run names (bm-test)
    (models_dir() / "catalog.json").write_text(_json.dumps({"models": {"tiny": {
        "name": "tiny", "id": "bm-test", "path": str(tiny_model["path"])}}}))
    set_policy(who["admin"], policy_file(tmp_path))
    asked = []

    def answers(ref, conversations, **_options):
        asked.append(ref)
        who = "challenger" if ref.startswith("models:/") else "champion"  # the base model answers as the champion
        return [{"text": f"{who} answer {i}", "latency_ms": 1.0, "tokens": 3, "error": None}
                for i, _ in enumerate(conversations)]

    check_id = create(who["alice"], "solo", version, n=4, seed=3, answer=answers)["check_id"]
    assert asked == ["models:/solo/1", str(tiny_model["path"])]  # the version, then the base model
    items = blind_items(check_id)
    assert all(i["answer_b"] is not None and i["choices"] == ["A", "B", "same"] for i in items)
    assert summary(check_id)["baseline"] == "tiny (bm-test)"
    record_many(who["alice"], check_id, [{"item": i["item"], "preferred": letter_of(i, "champion")
                                          if i["item"] == 1 else "same"} for i in items])
    passed, detail, evidence = judge(model_state("solo"), version, release_policy().spot_check)
    assert not passed and "75% of 4 items" in detail  # one item worse than the base: below the 80% policy
