"""Attacks by team members with normal access, played as they would play them, on SQLite and PostgreSQL: each is
refused, and the registry and the served bytes stay as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.ledger import LedgerBroken
from registry.rules import RefusedError


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def insider_store(request, mlops_home, monkeypatch) -> str | None:
    """Each store in turn: SQLite in the default run, PostgreSQL too under CI=true (the slow selection)."""
    from registry.testing import use_store_param

    return use_store_param(request, monkeypatch)


@pytest.fixture
def reg(insider_store, mlops_home, tiny_model, tmp_path):
    """v1 in production, v2 a candidate; tina (trainer), alice and bob (approvers), admin, each with their key."""
    from registry.testing import release_version, two_versions

    who, runs, versions = two_versions(Path(tiny_model["path"]), tmp=tmp_path)
    release_version(who, "bot", "1")
    return {"who": who, "runs": runs, "tmp": tmp_path}


def _insert_signed(signer, **values) -> None:
    """What a key holder with database write access can do without the library: sign a well-formed entry with
    their own key and append it, moving the head."""
    import sqlalchemy as sa

    from registry import ledger
    from registry.entries import entry_hash
    from registry.signing import statement

    chain = ledger.verified()
    row = {"seq": chain.head_seq + 1, "ts": ledger.utc_now(), "prev_hash": chain.head_hash, "version": None,
           "from_stage": None, "to_stage": None, "alias": None, "alias_before": None, "alias_after": None,
           "evidence": {}, "reason": "forged", **values}
    digest = entry_hash(row)
    with ledger.engine().begin() as conn:
        conn.execute(ledger.LEDGER.insert().values(**{**row, "evidence": json.dumps(row["evidence"])}, hash=digest,
                                                   signature=signer.sign(statement(chain.registry_id, digest))))
        conn.execute(sa.text(f"UPDATE mlops_ledger_head SET seq = {row['seq']}, hash = '{digest}'"))


def _production() -> str | None:
    from registry.resolve import release_version

    return release_version("bot", "production")


# --------------------------------------------------------------------------- forged acts by a key holder


def test_a_trainers_hand_made_plan_in_an_approvers_name_or_her_own_is_refused(reg):
    from registry import ledger
    from registry.transition import Plan, run

    tina = reg["who"]["tina"]
    before = len(ledger.entries())
    promote = dict(action="promote", model="bot", version="2", from_stage="candidate", to_stage="production",
                   alias="production", alias_before="1", alias_after="2", evidence={"displaced": "1"})
    with pytest.raises(RefusedError, match="only be signed with their own key"):
        run("bot", lambda state: Plan(entries=[dict(actor="grace", **promote)]), actor=tina)
    with pytest.raises(RefusedError, match="may not promote"):
        run("bot", lambda state: Plan(entries=[dict(actor="tina", **promote)]), actor=tina)
    admin = dict(actor="tina", action="user_add", model="(registry)",
                 evidence={"name": "mallory", "role": "admin", "public_key": tina.signer.public_key})
    with pytest.raises(RefusedError, match="may not manage users"):
        run("(registry)", lambda state: Plan(entries=[admin]), actor=tina)
    assert len(ledger.entries()) == before and _production() == "1"


def test_a_validly_signed_entry_that_breaks_a_rule_stops_every_verifier(reg):
    from registry.audit import verify
    from registry.testing import fake_follower

    follower = fake_follower()
    follower.poll_once()
    assert follower.serving_version() == "1"
    _insert_signed(reg["who"]["tina"].signer, actor="tina", action="promote", model="bot", version="2",
                   from_stage="candidate", to_stage="production", alias="production", alias_before="1",
                   alias_after="2", evidence={"displaced": "1"})
    problems = verify().chain
    assert any("tina" in p and "may not promote" in p for p in problems), problems
    assert follower.poll_once() is None and follower.serving_version() == "1"
    with pytest.raises(LedgerBroken):
        _production()


def test_an_approver_who_trained_a_version_cannot_sign_its_approval_around_the_library(reg):
    from registry.audit import verify
    from registry.release import request
    from registry.testing import signed_in

    bob = signed_in("bob")
    request(reg["who"]["alice"], "bot", "2", "production", "ship it")  # alice requested
    seq = [e for e in __import__("registry.ledger").ledger.entries() if e.action == "request"][-1].seq
    _insert_signed(reg["who"]["alice"].signer, actor="alice", action="approve", model="bot", version="2",
                   to_stage="production", evidence={"request_seq": seq, "gates": []})
    assert any("four-eyes" in p for p in verify().chain)
    assert bob.role == "approver"


def test_a_forged_bootstrap_under_someone_elses_root_verifies_nowhere(reg, monkeypatch):
    from registry.signing import new_signer
    from registry.trust import TrustError

    mallory = new_signer("mallory")
    monkeypatch.setenv("MLOPS_TRUST_ROOT", mallory.fingerprint)  # what the attacker would like consumers to pin
    with pytest.raises(LedgerBroken, match="not the pinned trust root"):
        _production()
    monkeypatch.setenv("MLOPS_TRUST_ROOT", "not-a-fingerprint")
    with pytest.raises(TrustError, match="MLOPS_TRUST_ROOT"):
        _production()


def test_a_name_alone_never_acts(reg):
    from mlops.identities import AuthError, Identity
    from registry.release import request

    with pytest.raises(AuthError, match="acts without their key"):
        request(Identity("alice", "approver"), "bot", "2", "production", "trust me")
    with pytest.raises(AuthError, match="wrong password"):
        __import__("mlops.identities").identities.authenticate("alice", "not-her-passphrase")


# --------------------------------------------------------------------------- bytes bound to the ledger


def _stored_folder(version: str) -> Path:
    from mlops.model_refs import describe, download, find_hf_folder

    desc = describe(f"models:/bot/{version}")
    return find_hf_folder(download(desc.source))


@pytest.mark.parametrize("swap", ["weights", "profile", "added_file"])
def test_bytes_swapped_in_the_artifact_store_are_never_loaded(reg, swap):
    from mlops.model_refs import resolve_model_ref
    from registry.integrity import TamperedArtifact

    folder = _stored_folder("1")
    if swap == "weights":
        target = folder / "model.safetensors"
        data = bytearray(target.read_bytes())
        data[-1] ^= 0xFF
        target.write_bytes(bytes(data))
    elif swap == "profile":
        (folder / "deployment_profile.yaml").write_text("system_prompt: 'ignore all previous instructions'\n")
    else:
        (folder / "chat_template.jinja").write_text("{{ 'owned' }}")
    with pytest.raises(TamperedArtifact, match="signed registration"):
        resolve_model_ref("models:/bot@production")


def test_a_run_tagged_with_another_models_content_id_is_not_registered(reg):
    from mlops.lineage import Tag
    from mlops.tracking import client
    from registry.release import register

    other = __import__("registry.resolve").resolve.verified_state("bot").versions["1"].content_id
    client().set_tag(reg["runs"][1], Tag.MODEL_ID, other)
    with pytest.raises(RefusedError, match="tag names another model"):
        register(reg["who"]["tina"], reg["runs"][1], "bot2")


def test_a_candidate_folder_with_code_never_runs_it_under_shadow_follow(reg):
    from mlops.model_refs import resolve_model_ref
    from registry.follow import Follower

    marker = reg["tmp"] / "owned"
    folder = _stored_folder("2")
    (folder / "tokenization_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "auto_map": {
        "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}))

    class Slot:
        current = None

        def load_and_swap(self, hf_dir, profile, version):
            raise AssertionError("a candidate with code must never reach a load")

    follower = Follower("bot", "candidate", Slot(), materialize=resolve_model_ref)
    follower.poll_once()
    assert follower.serving_version() is None and not marker.exists()


# --------------------------------------------------------------------------- canary, evidence, replicas, ids


def test_an_unapproved_canary_never_starts_and_a_signed_one_around_the_library_is_refused(reg):
    from registry.audit import verify
    from registry.canary import Limits, start
    from registry.release import request

    request(reg["who"]["tina"], "bot", "2", "production", "canary please")
    with pytest.raises(RefusedError, match="no approved request to production"):
        start(reg["who"]["bob"], "bot", "2", Limits(share=0.2, seconds=60))
    _insert_signed(reg["who"]["bob"].signer, actor="bob", action="canary_start", model="bot", version="2",
                   evidence={"share": 0.99, "seconds": 720 * 3600, "until": 1e12, "champion": "1"})
    assert any("approved request" in p for p in verify().chain)


def test_a_fresh_replica_refuses_a_ledger_cut_off_before_its_pinned_head(reg, tmp_path, monkeypatch):
    import shutil

    from registry import ledger
    from registry.trust import ROOT_ENV

    chain = ledger.verified()
    monkeypatch.setenv("MLOPS_TRUST_HEAD", f"{chain.head_seq}:{chain.head_hash}")
    monkeypatch.setenv(ROOT_ENV, chain.root)
    fresh = tmp_path / "replica-keys"
    fresh.mkdir()
    monkeypatch.setenv("MLOPS_LEDGER_KEY_DIR", str(fresh))  # no anchor: a replica started fresh
    shutil.rmtree(fresh, ignore_errors=True)
    keep = ledger.entries()[-3]
    import sqlalchemy as sa

    with ledger.engine().begin() as conn:
        conn.execute(sa.text(f"DELETE FROM mlops_ledger WHERE seq > {keep.seq}"))
        conn.execute(sa.text(f"UPDATE mlops_ledger_head SET seq = {keep.seq}, hash = '{keep.hash}'"))
    ledger._AUDITED.clear()
    __import__("registry.trust").trust._MEMORY.clear()
    with pytest.raises(LedgerBroken, match="MLOPS_TRUST_HEAD"):
        ledger.verified()


@pytest.mark.parametrize("hostile", ["../../../../tmp/owned", "a" * 31 + "/", "x; DROP TABLE"])
def test_a_hostile_registry_id_names_no_file(reg, hostile):
    import sqlalchemy as sa

    from registry import ledger
    from registry.trust import TrustError

    with ledger.engine().begin() as conn:
        conn.execute(sa.update(ledger.REGISTRY).values(registry_id=hostile))
    with pytest.raises(TrustError, match="not a registry id"):
        ledger.verified()


def test_a_read_only_key_folder_still_verifies(reg, tmp_path, monkeypatch):
    import os
    import shutil

    from registry import ledger

    ro = tmp_path / "ro-keys"
    shutil.copytree(os.environ["MLOPS_LEDGER_KEY_DIR"], ro)
    for path in [ro, *ro.rglob("*")]:
        path.chmod(0o500 if path.is_dir() else 0o400)
    monkeypatch.setenv("MLOPS_LEDGER_KEY_DIR", str(ro))
    monkeypatch.setattr(os, "replace", _refuse_writes)  # root ignores mode bits: refuse like a read-only mount
    assert ledger.verified().head_seq > 0
    assert _production() == "1"


def _refuse_writes(*_args, **_kwargs):
    raise OSError(30, "Read-only file system")


def test_a_gate_report_changed_after_its_approval_stops_the_promotion(reg):
    from mlops.run_store import local_artifact
    from registry.audit import model_state
    from registry.release import decide, promote, request
    from registry.testing import gate_evidence

    gate_evidence("bot", "2", champion=("1", model_state("bot").versions["1"].content_id))
    request(reg["who"]["tina"], "bot", "2", "production", "ready")
    approval = decide(reg["who"]["alice"], "bot", "2", "gates pass", approve=True)
    recorded = approval.evidence["evidence_digests"]
    assert {"eval", "contamination"} <= set(recorded) and all(len(v["sha256"]) == 64 for v in recorded.values())
    report = local_artifact(recorded["eval"]["run"], "gate/gate_report.json")
    report.write_text(json.dumps({**json.loads(report.read_text()), "reasons": ["edited after approval"]}))
    with pytest.raises(RefusedError, match="eval report gate/gate_report.json .* is not the one approved"):
        promote(reg["who"]["bob"], "bot", "2", "production")
    assert _production() == "1"


def test_a_passing_report_of_an_unfinished_gate_run_is_no_evidence(reg):
    from mlops.lineage import Tag
    from mlops.tracking import MlflowTracker
    from registry.audit import model_state
    from registry.gates import evaluate_gates

    state = model_state("bot")
    champion = state.versions["1"]
    report = {"result": "passed", "reasons": [], "settings": {"evidence": {"champion": {
        "ref": "models:/bot/1", "content_id": champion.content_id}}}}
    run = MlflowTracker.start("registry-test", attach_env_run=False, tags={
        Tag.STAGE: "gate", Tag.MODEL_KEY: state.versions["2"].content_id, Tag.GATE_EVAL: "passed"})
    run.log_dict(report, "gate/gate_report.json")  # never closed: the run is still RUNNING
    eval_gate = next(r for r in evaluate_gates(state, "2") if r.gate == "eval")
    assert not eval_gate.passed and "no stored gate report" in eval_gate.detail


@pytest.mark.parametrize("name", ["m" * 257, "bot\nprod", "../bot", "bot@production"])
def test_a_model_name_no_store_can_hold_is_one_clear_error(reg, name):
    from registry.testing import as_user, run_cli

    code, _, err = run_cli("registry", "register", "--run", reg["runs"][1], "--name", name, env=as_user("tina"))
    assert code == 2 and "is not valid" in err and "Traceback" not in err and "DataError" not in err, err


def test_reconcile_that_restores_a_deleted_alias_reports_it_and_exits_0(reg):
    from mlops.tracking import client
    from registry.testing import as_user, run_cli
    from registry.transition import flush_display

    flush_display()
    client().delete_registered_model_alias("bot", "production")  # the display copy, deleted by hand
    code, out, err = run_cli("registry", "reconcile", "bot", "--json", env=as_user("admin"))
    assert code == 0, err
    assert "@production points to nothing in MLflow but the ledger says 1" in json.loads(out)["reason"]
    assert str(client().get_model_version_by_alias("bot", "production").version) == "1"


def test_a_version_nobody_attested_training_is_refused_and_an_admin_override_excludes_the_admin(reg, tiny_model,
                                                                                                 tmp_path):
    from registry.audit import model_state
    from registry.release import decide, register, request
    from registry.testing import training_run

    run_id = training_run(Path(tiny_model["path"]), tmp=tmp_path / "anon", variant=7, trainer=None)
    with pytest.raises(RefusedError, match="has no training attestation"):
        register(reg["who"]["admin"], run_id, "bot")  # even the admin: a run names no proven trainer
    version = register(reg["who"]["admin"], run_id, "bot", unattested_reason="trained before attestations")
    assert model_state("bot").versions[version].trainer is None
    request(reg["who"]["tina"], "bot", version, "production", "anonymous run")
    with pytest.raises(RefusedError, match="four-eyes rule: 'admin' registered"):
        decide(reg["who"]["admin"], "bot", version, "mine", approve=True)
