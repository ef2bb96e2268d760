"""Registry governance on a real embedded store: lifecycle, approvals, four-eyes, gates, CAS, rollback, ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlops.identities import AuthError
from mlops.lineage import Tag
from registry.transition import ConcurrentChangeError, RefusedError


@pytest.fixture
def reg(mlops_home, tiny_model, tmp_path):
    """Identities, and two registered candidate versions of 'bot' trained by tina (`third(reg)` adds one)."""
    from mlops.tracking import init_experiment
    from registry.release import register
    from registry.testing import make_identities, training_run

    init_experiment("registry-test")
    who = make_identities()
    runs = [training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=i) for i in (1, 2)]
    versions = [register(who["tina"], run_id, "bot") for run_id in runs]
    return {"who": who, "runs": runs, "versions": versions, "tmp": tmp_path, "tiny": tiny_model}


def third(reg) -> str:
    from registry.release import register
    from registry.testing import training_run

    run_id = training_run(Path(reg["tiny"]["path"]), tmp=reg["tmp"], variant=3)
    return register(reg["who"]["tina"], run_id, "bot")


def release(reg, version: str, *, champion: tuple[str, str] | None = None) -> None:
    from registry.testing import release_version

    release_version(reg["who"], "bot", version, champion=champion)


def aliases() -> dict:
    from registry.transition import registry_aliases

    return registry_aliases("bot")


def content(version: str) -> str:
    from registry.audit import model_state

    return model_state("bot").versions[version].content_id


def ledger_size() -> int:
    from registry import ledger

    return len(ledger.entries())


def test_register_lands_in_candidate_with_ledger_entry_and_stage_tag(reg):
    from registry.audit import model_state
    from registry.versions import version_tags

    state = model_state("bot")
    assert [state.stage_of(v) for v in reg["versions"]] == ["candidate"] * 2
    vs = state.versions["1"]
    assert vs.registered_by == "tina" and vs.trainer == "tina" and vs.content_id.startswith("mc-")
    assert version_tags("bot", "1")["registry.stage"] == "candidate"


def test_register_refuses_incomplete_lineage_naming_each_missing_tag(reg):
    from registry.release import register
    from registry.testing import training_run

    run_id = training_run(Path(reg["tiny"]["path"]), tmp=reg["tmp"], variant=9,
                          drop=(Tag.DATA_RUN, Tag.CHECKPOINT_MANIFEST))
    before = ledger_size()
    with pytest.raises(RefusedError, match=r"missing tags: mlops.data_run_id, mlops.checkpoint_manifest_uri"):
        register(reg["who"]["tina"], run_id, "bot")
    assert ledger_size() == before


def test_a_viewer_cannot_act_and_a_wrong_password_is_refused(reg):
    from mlops.identities import authenticate
    from registry.release import promote

    with pytest.raises(AuthError, match="role 'viewer', which may not promote"):
        promote(reg["who"]["vic"], "bot", "1", "staging")
    with pytest.raises(AuthError, match="unknown user or wrong password"):
        authenticate("alice", "not-her-password")
    assert aliases() == {}


def test_every_transition_outside_the_table_is_refused_with_the_allowed_set():
    from registry.release import check_transition
    from registry.state import STAGES, TRANSITIONS, ModelState, VersionState

    for current in STAGES:
        for target in STAGES:
            state = ModelState("bot", versions={"1": VersionState("1", current, "x", "t", {})})
            if target in TRANSITIONS[current]:
                check_transition(state, "1", target)
            else:
                with pytest.raises(RefusedError, match=f"is {current}; it may move to"):
                    check_transition(state, "1", target)


def test_production_needs_an_approved_request(reg):
    from registry.release import promote

    with pytest.raises(RefusedError, match="no approved request to production"):
        promote(reg["who"]["bob"], "bot", "1", "production")
    assert aliases() == {}


def test_a_gate_refusal_counts_from_a_failed_run_and_a_pass_only_from_a_finished_one(reg):
    from mlops.tracking import client
    from registry.audit import drift, model_state
    from registry.gates import newest_gate_report
    from registry.testing import gate_evidence

    refused = gate_evidence("bot", "1", passed=False)  # `mlflow run` marks a gate that exits 1 FAILED
    client().set_terminated(refused, "FAILED")
    client().set_model_version_tag("bot", "1", Tag.GATE_EVAL, "failed")
    assert newest_gate_report(content("1"))[1]["result"] == "failed"
    assert not [p for p in drift(model_state("bot")) if "gate" in p]
    passed = gate_evidence("bot", "1")
    client().set_terminated(passed, "FAILED")  # a pass whose run did not finish is no pass
    assert newest_gate_report(content("1"))[1]["result"] == "failed"


def test_four_eyes_rule_refuses_the_trainer_registrar_and_requester(reg):
    from registry.release import decide, request
    from registry.testing import gate_evidence

    gate_evidence("bot", "1")
    request(reg["who"]["alice"], "bot", "1", "production", "please")
    before = ledger_size()
    with pytest.raises(RefusedError, match="'alice' requested version 1"):
        decide(reg["who"]["alice"], "bot", "1", "self-approval", approve=True)
    with pytest.raises(AuthError):
        decide(reg["who"]["tina"], "bot", "1", "trainer approves", approve=True)  # a trainer may not approve at all
    assert ledger_size() == before
    decide(reg["who"]["bob"], "bot", "1", "second pair of eyes", approve=True)


def test_four_eyes_rule_refuses_an_admin_who_trained_the_version(reg):
    from registry.release import decide, register, request
    from registry.testing import gate_evidence, training_run

    run_id = training_run(Path(reg["tiny"]["path"]), tmp=reg["tmp"], variant=7, trainer="admin")
    version = register(reg["who"]["tina"], run_id, "bot")
    gate_evidence("bot", version)
    request(reg["who"]["tina"], "bot", version, "production", "go")
    with pytest.raises(RefusedError, match="'admin' trained version"):
        decide(reg["who"]["admin"], "bot", version, "mine", approve=True)


def test_full_release_moves_alias_stage_and_ledger(reg):
    from registry.audit import model_state, verify, who_approved
    from registry.versions import version_tags

    release(reg, "1")
    assert aliases() == {"production": "1"}
    assert model_state("bot").stage_of("1") == "production"
    assert version_tags("bot", "1")["registry.stage"] == "production"
    assert [r["approver"] for r in who_approved("bot", "1")] == ["alice"]
    assert verify("bot").ok


def test_approval_is_refused_while_the_eval_gate_has_no_evidence(reg):
    from registry.release import decide, request

    request(reg["who"]["tina"], "bot", "1", "production", "ready")
    with pytest.raises(RefusedError, match="eval gate failed: no stored gate report"):
        decide(reg["who"]["alice"], "bot", "1", "ok", approve=True)


def test_a_failing_gate_report_refuses_and_an_admin_override_is_ledgered_and_shown(reg):
    from registry.audit import status
    from registry.release import decide, override, request
    from registry.testing import gate_evidence

    gate_evidence("bot", "1", passed=False)
    request(reg["who"]["tina"], "bot", "1", "production", "ready")
    with pytest.raises(RefusedError, match="eval gate failed: the gate report .* failed: general_knowledge"):
        decide(reg["who"]["alice"], "bot", "1", "ok", approve=True)
    with pytest.raises(AuthError):
        override(reg["who"]["alice"], "bot", "1", "eval", "approvers cannot override")
    override(reg["who"]["admin"], "bot", "1", "eval", "known flaky task, accepted by the product owner")
    decide(reg["who"]["alice"], "bot", "1", "ok with the override", approve=True)
    shown = status("bot")["versions"][-1]["overrides"]
    assert shown[0]["gate"] == "eval" and shown[0]["by"] == "admin"


def test_a_gate_report_against_an_earlier_champion_is_stale(reg):
    from registry.release import decide, request
    from registry.testing import gate_evidence

    release(reg, "1")
    gate_evidence("bot", "2")  # compared with no champion, but v1 is champion now
    request(reg["who"]["tina"], "bot", "2", "production", "ready")
    with pytest.raises(RefusedError, match="it is stale"):
        decide(reg["who"]["alice"], "bot", "2", "ok", approve=True)
    gate_evidence("bot", "2", champion=("1", content("1")))
    decide(reg["who"]["alice"], "bot", "2", "ok", approve=True)


def test_data_and_contamination_gates_read_the_stored_reports(reg):
    from registry.audit import model_state
    from registry.gates import evaluate_gates
    from registry.release import register
    from registry.testing import data_run, gate_evidence, training_run

    bad_data = data_run(admitted_failure=True)
    run_id = training_run(Path(reg["tiny"]["path"]), tmp=reg["tmp"], variant=8, data_run_id=bad_data)
    version = register(reg["who"]["tina"], run_id, "bot")
    gate_evidence("bot", version, offending=("biz_refunds_mc-3",))
    results = {r.gate: r for r in evaluate_gates(model_state("bot"), version)}
    assert results["lineage"].passed and results["eval"].passed
    assert not results["data"].passed and "admitted without passing" in results["data"].detail
    assert not results["contamination"].passed and "biz_refunds_mc-3" in results["contamination"].detail


def test_compare_and_set_refuses_when_production_moved_since_it_was_read(reg):
    from registry.release import decide, promote, request
    from registry.testing import gate_evidence

    release(reg, "1")
    gate_evidence("bot", "2", champion=("1", content("1")))
    request(reg["who"]["tina"], "bot", "2", "production", "ready")
    decide(reg["who"]["alice"], "bot", "2", "ok", approve=True)
    before = ledger_size()
    with pytest.raises(ConcurrentChangeError, match="production of 'bot' moved from nothing to 1 since you loaded"):
        promote(reg["who"]["bob"], "bot", "2", "production", expect_version="none")
    assert aliases() == {"production": "1"} and ledger_size() == before
    promote(reg["who"]["bob"], "bot", "2", "production", expect_version="1")
    assert aliases() == {"production": "2"}


def test_rollback_steps_back_through_history_and_marks_rolled_back(reg):
    from registry.audit import model_state, verify
    from registry.release import rollback

    release(reg, "1")
    release(reg, "2", champion=("1", content("1")))
    release(reg, third(reg), champion=("2", content("2")))
    rollback(reg["who"]["bob"], "bot", "v3 answers in the wrong language")
    state = model_state("bot")
    assert aliases() == {"production": "2"} and state.stage_of("3") == "rolled_back"
    assert state.versions["3"].stage_reason == "v3 answers in the wrong language"
    rollback(reg["who"]["bob"], "bot", "v2 too")
    assert aliases() == {"production": "1"}
    with pytest.raises(RefusedError, match="no earlier production version"):
        rollback(reg["who"]["bob"], "bot", "again")
    assert aliases() == {"production": "1"} and verify("bot").ok


def test_rollback_refuses_a_target_whose_artifacts_were_altered(reg):
    from mlops.model_refs import materialize
    from registry.release import rollback

    release(reg, "1")
    release(reg, "2", champion=("1", content("1")))
    weights = next(materialize("models:/bot/1").hf_dir.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-4] + b"\x00\x00\x00\x01")
    before = ledger_size()
    with pytest.raises(RefusedError, match="the artifacts were altered"):
        rollback(reg["who"]["bob"], "bot", "bad release")
    assert aliases() == {"production": "2"} and ledger_size() == before


def test_history_at_a_time_says_what_was_in_production(reg):
    import time

    from registry.audit import history

    release(reg, "1")
    time.sleep(0.05)
    between = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e6) % 10**6:06d}Z"
    time.sleep(0.05)
    release(reg, "2", champion=("1", content("1")))
    assert history("bot", between)["aliases"] == {"production": "1"}
    assert history("bot")["aliases"] == {"production": "2"}
    assert history("bot", "2000-01-01T00:00:00Z")["aliases"] == {}


@pytest.mark.parametrize("tamper", ["edit", "delete", "insert", "truncate"])
def test_verify_detects_a_tampered_ledger(reg, tamper):
    import sqlalchemy as sa

    from registry import ledger
    from registry.audit import verify

    release(reg, "1")
    assert verify().ok
    eng = ledger.engine()
    with eng.begin() as conn:
        if tamper == "edit":
            conn.execute(sa.text("UPDATE mlops_ledger SET actor = 'mallory' WHERE seq = 4"))
        elif tamper == "delete":
            conn.execute(sa.text("DELETE FROM mlops_ledger WHERE seq = 2"))
        elif tamper == "insert":
            conn.execute(sa.text("UPDATE mlops_ledger SET seq = seq + 100 WHERE seq >= 3"))
            conn.execute(sa.text("INSERT INTO mlops_ledger (seq, ts, actor, action, model, prev_hash, hash) "
                                 "VALUES (3, '2026-01-01', 'mallory', 'approve', 'bot', 'x', 'y')"))
        else:
            last = conn.execute(sa.text("SELECT max(seq) FROM mlops_ledger")).scalar()
            conn.execute(sa.text(f"DELETE FROM mlops_ledger WHERE seq = {last}"))
    result = verify()
    assert not result.ok and result.chain
    expected = {"edit": "entry 4", "delete": "expected entry 2", "insert": "entry 3",
                "truncate": "entries after"}[tamper]
    assert expected in " ".join(result.chain)


def test_an_alias_moved_behind_the_registrys_back_is_reported_refused_and_reconciled(reg):
    from mlops.tracking import client
    from registry.audit import verify
    from registry.release import promote, reconcile

    release(reg, "1")
    from registry.transition import flush_display

    flush_display()  # the acts' own copies land first
    client().set_registered_model_alias("bot", "production", "2")  # the MLflow UI's pencil icon
    result = verify("bot")
    assert "@production points to 2 in MLflow but the ledger says 1" in result.drift["bot"][0]
    with pytest.raises(RefusedError, match="moved outside the registry"):
        promote(reg["who"]["bob"], "bot", "2", "staging")
    with pytest.raises(AuthError):
        reconcile(reg["who"]["bob"], "bot")
    entry = reconcile(reg["who"]["admin"], "bot")
    assert entry.action == "reconcile" and aliases() == {"production": "1"} and verify("bot").ok


def test_a_failed_ledger_write_leaves_alias_and_ledger_as_they_were(reg, monkeypatch):
    import sqlalchemy as sa

    from registry import ledger
    from registry.release import promote

    def broken(*args, **kwargs):
        raise sa.exc.OperationalError("INSERT", {}, Exception("database is locked"))

    before = ledger_size()
    with monkeypatch.context() as patched:  # undo only this patch, not the fixture's home
        patched.setattr(ledger, "append", broken)
        with pytest.raises(Exception, match="database is locked"):
            promote(reg["who"]["bob"], "bot", "1", "staging")
    assert aliases() == {} and ledger_size() == before


@pytest.mark.slow  # heavy end-to-end: the default run stays under 15 minutes; CI runs it
def test_a_locked_sqlite_database_refuses_the_transition_cleanly(reg, monkeypatch):
    import sqlite3

    from mlops.tracking import RegistryUnavailableError
    from registry.ledger import LedgerError
    from registry.release import promote
    from registry.transition import flush_display, registry_aliases

    flush_display()  # the fixture's own acts leave display tags to write; they must not meet the lock below
    monkeypatch.setenv("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
    monkeypatch.setenv("MLOPS_SQLITE_BUSY_TIMEOUT", "2")  # the refusal, not 30 s of waiting, is under test
    monkeypatch.setattr("registry.db._ENGINES", {})
    path = str(Path(reg["tmp"]) / "home" / ".mlops" / "mlflow.db")
    blocker = sqlite3.connect(path, timeout=1, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises((LedgerError, RegistryUnavailableError)):
            promote(reg["who"]["bob"], "bot", "1", "staging")
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert registry_aliases("bot") == {}
