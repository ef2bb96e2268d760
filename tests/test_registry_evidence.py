"""Evidence the verifier can check, not trust (issue 39): attestations signed by whoever ran each step, gates the
replay re-derives, training proven at registration, serving bytes fixed at approval. Each attack is played as an
insider with a valid key and normal access would play it, on SQLite and PostgreSQL, and refused with nothing
changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.ledger import LedgerBroken
from registry.rules import RefusedError


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def store(request, mlops_home, monkeypatch) -> str | None:
    from registry.testing import use_store_param

    return use_store_param(request, monkeypatch)


@pytest.fixture
def reg(store, mlops_home, tiny_model, tmp_path):
    """v1 in production (released on attested evidence), v2 a candidate registered by tina."""
    from registry.testing import release_version, two_versions

    who, runs, versions = two_versions(Path(tiny_model["path"]), tmp=tmp_path)
    release_version(who, "bot", "1")
    return {"who": who, "runs": runs, "tmp": tmp_path, "hf": Path(tiny_model["path"])}


def _snapshot():
    from registry import ledger
    from registry.resolve import release_version

    return len(ledger.entries()), release_version("bot", "production")


def _champion_content() -> str:
    from registry.audit import model_state

    return model_state("bot").versions["1"].content_id


def _forged_gate_report(model: str, version: str, champion: str) -> str:
    """What a bare MLflow client writes: a passing gate report in a FINISHED gate run, with no identity."""
    from mlops.lineage import Tag
    from mlops.model_refs import describe
    from mlops.tracking import MlflowTracker

    desc = describe(f"models:/{model}/{version}")
    ev = MlflowTracker.start("forged", attach_env_run=False, tags={Tag.STAGE: "eval", Tag.MODEL_KEY: desc.content_id})
    ev.log_dict({"status": "checked", "offending": []}, "eval/contamination.json")
    ev.close()
    report = {"result": "passed", "reasons": [], "settings": {"evidence": {
        "champion": {"ref": f"models:/{model}/1", "content_id": champion}}}}
    gate = MlflowTracker.start("forged", attach_env_run=False, tags={
        Tag.STAGE: "gate", Tag.MODEL_KEY: desc.content_id, Tag.EVAL_RUN: ev.run_id, Tag.GATE_EVAL: "passed"})
    gate.log_dict(report, "gate/gate_report.json")
    gate.close()
    return gate.run_id


def test_a_gate_report_nobody_permitted_attested_is_no_evidence_whoever_wrote_it(reg):
    from registry.release import decide, request
    from registry.testing import gate_evidence

    who = reg["who"]
    _forged_gate_report("bot", "2", _champion_content())
    request(who["tina"], "bot", "2", "production", "ready")
    before = _snapshot()
    with pytest.raises(RefusedError, match="no stored gate report about v2 is attested"):
        decide(who["alice"], "bot", "2", "forged report", approve=True)
    # The trainer signs a passing report with her own valid key: the policy does not name trainers for gates.
    gate_evidence("bot", "2", champion=("1", _champion_content()), attester="tina")
    with pytest.raises(RefusedError, match="no stored gate report about v2 is attested"):
        decide(who["alice"], "bot", "2", "tina vouches for herself", approve=True)
    assert _snapshot() == before


def test_an_approval_signed_by_hand_claiming_a_failed_gate_passed_is_refused_by_the_replay(reg):
    from registry import ledger
    from registry.audit import model_state
    from registry.gates import attestations, evaluate_gates
    from registry.release import request
    from registry.testing import gate_evidence
    from registry.transition import Plan, run

    who = reg["who"]
    gate_evidence("bot", "2", passed=False, champion=("1", _champion_content()))
    request(who["tina"], "bot", "2", "production", "ready")
    state = model_state("bot")
    results = evaluate_gates(state, "2")
    assert any(r.gate == "eval" and not r.passed for r in results)
    claimed = [{**r.as_dict(), "passed": True, "ok": True} for r in results]
    approve = dict(actor="alice", action="approve", model="bot", version="2", to_stage="production",
                   reason="all green, trust me",
                   evidence={"request_seq": state.pending()[-1].seq, "gates": claimed, "gguf": None,
                             "attestations": attestations(results)})
    before = _snapshot()
    with pytest.raises(RefusedError, match="the eval gate does not pass on the evidence it names"):
        run("bot", lambda s: Plan(entries=[approve]), actor=who["alice"])
    assert _snapshot() == before
    # The same entry written straight into the database with alice's own key: every verifier refuses the ledger.
    _insert_signed(who["alice"].signer, **approve)
    with pytest.raises(LedgerBroken, match="the eval gate does not pass"):
        ledger.verified()


def _insert_signed(signer, **values) -> None:
    import sqlalchemy as sa

    from registry import ledger
    from registry.entries import entry_hash
    from registry.signing import statement

    chain = ledger.verified()
    row = {"seq": chain.head_seq + 1, "ts": ledger.utc_now(), "prev_hash": chain.head_hash, "version": None,
           "from_stage": None, "to_stage": None, "alias": None, "alias_before": None, "alias_after": None,
           "evidence": {}, "reason": "forged", **values}
    row["evidence"] = json.loads(json.dumps(row["evidence"]))
    digest = entry_hash(row)
    with ledger.engine().begin() as conn:
        conn.execute(ledger.LEDGER.insert().values(**{**row, "evidence": json.dumps(row["evidence"])}, hash=digest,
                                                   signature=signer.sign(statement(chain.registry_id, digest))))
        conn.execute(sa.text(f"UPDATE mlops_ledger_head SET seq = {row['seq']}, hash = '{digest}'"))


def test_a_run_nobody_attested_is_refused_at_registration_and_an_admin_override_is_ledgered(reg):
    from registry.audit import model_state
    from registry.release import register
    from registry.testing import training_run

    who = reg["who"]
    anonymous = training_run(reg["hf"], tmp=reg["tmp"] / "anon", variant=7, trainer=None)
    before = _snapshot()
    with pytest.raises(RefusedError, match="has no training attestation.*--unattested-reason"):
        register(who["tina"], anonymous, "bot")
    # An approver who trains may not vouch for training (the policy names trainers): her signature is no proof.
    by_approver = training_run(reg["hf"], tmp=reg["tmp"] / "alice", variant=8, trainer="alice")
    with pytest.raises(RefusedError, match="has no training attestation"):
        register(who["tina"], by_approver, "bot")
    assert _snapshot() == before
    with pytest.raises(Exception, match="may not override"):
        register(who["tina"], anonymous, "bot", unattested_reason="trust me")
    version = register(who["admin"], anonymous, "bot", unattested_reason="legacy run, trained before attestations")
    vs = model_state("bot").versions[version]
    assert vs.trainer is None and vs.evidence["unattested"]["reason"].startswith("legacy run")
    assert vs.registered_by == "admin"


def test_four_eyes_excludes_whoever_signed_the_training_not_whoever_the_run_tag_names(reg):
    from registry.release import decide, register, request
    from registry.testing import gate_evidence, training_run

    who = reg["who"]
    # Tagged as tina's, signed by the admin (who really ran it): the admin is the trainer.
    run_id = training_run(reg["hf"], tmp=reg["tmp"] / "tagged", variant=9, trainer="tina", signer="admin")
    version = register(who["tina"], run_id, "bot")
    gate_evidence("bot", version, champion=("1", _champion_content()))
    request(who["bob"], "bot", version, "production", "ready")
    with pytest.raises(RefusedError, match="four-eyes rule: 'admin' trained"):
        decide(who["admin"], "bot", version, "my own", approve=True)


def test_a_registration_borrowing_a_gated_models_content_id_is_refused(reg):
    from registry.audit import model_state
    from registry.transition import Plan, run

    who = reg["who"]
    v2 = model_state("bot").versions["2"]
    forged = {**v2.evidence, "content_id": model_state("bot").versions["1"].content_id, "run_id": reg["runs"][1]}
    entry = dict(actor="tina", action="register", model="bot", version="99", to_stage="candidate", evidence=forged)
    before = _snapshot()
    with pytest.raises(RefusedError, match="is not the one its signed file list derives"):
        run("bot", lambda s: Plan(entries=[entry]), actor=who["tina"])
    assert _snapshot() == before


def _approved_v2(who) -> None:
    """v2 with attested gate evidence against v1, requested by tina and approved by alice."""
    from registry.release import decide, request
    from registry.testing import gate_evidence

    gate_evidence("bot", "2", champion=("1", _champion_content()))
    request(who["tina"], "bot", "2", "production", "ready")
    decide(who["alice"], "bot", "2", "fine", approve=True)


def test_promote_and_rollback_evidence_must_say_what_the_ledger_says(reg):
    from registry.audit import model_state
    from registry.release import plan_promote
    from registry.transition import Plan, run

    who = reg["who"]
    _approved_v2(who)
    honest = plan_promote(who["bob"], model_state("bot"), "bot", "2", "production").entries[0]
    before = _snapshot()
    for bad, match in (({"displaced": None}, "displaced"), ({"displaced_to": "candidate"}, "displaced"),
                       ({"released_aliases": ["staging"]}, "frees aliases")):
        entry = {**honest, "evidence": {**honest["evidence"], **bad}}
        with pytest.raises(RefusedError, match=match):
            run("bot", lambda s, entry=entry: Plan(entries=[entry]), actor=who["bob"])
    assert _snapshot() == before


def test_a_canary_must_end_at_its_start_plus_its_seconds(reg):
    import time

    from registry.audit import model_state
    from registry.transition import Plan, run

    who = reg["who"]
    _approved_v2(who)

    state = model_state("bot")
    limits = {"max_error_rate": 0.02, "max_p95_ratio": 1.5, "min_requests": 20}
    entry = dict(actor="bob", action="canary_start", model="bot", version="2", reason="forever",
                 evidence={"share": 0.1, "seconds": 60, "until": time.time() + 30 * 86400, "champion": "1",
                           "request_seq": state.approved_request("2", "production").seq, "limits": limits})
    before = _snapshot()
    with pytest.raises(RefusedError, match="which is not its start"):
        run("bot", lambda s: Plan(entries=[entry]), actor=who["bob"])
    assert _snapshot() == before


# --------------------------------------------------------------------------- serving bytes fixed at approval


def _package(who, version: str, sha: str, name: str = "tina"):
    from registry.integrity import record_package

    return record_package(who[name], "bot", version, sha256=sha, quantization="q8_0", llamacpp_version="0.3.36",
                          run_id="r" * 32)


def test_a_trainer_cannot_package_a_released_version_nor_sign_one_by_hand(reg):
    from registry.attestation import attest
    from registry.audit import model_state
    from registry.transition import Plan, run

    who = reg["who"]
    before = _snapshot()
    with pytest.raises(RefusedError, match="is production: the GGUF it serves was fixed at its approval"):
        _package(who, "1", "a" * 64)
    vs = model_state("bot").versions["1"]
    envelope = attest(who["tina"].signer, "package", {"model-q8_0.gguf": "a" * 64},
                      {"files_digest": vs.evidence["files_digest"], "quantization": "q8_0"})
    entry = dict(actor="tina", action="package", model="bot", version="1", reason="mine",
                 evidence={"sha256": "a" * 64, "quantization": "q8_0", "run": "r" * 32, "llamacpp_version": "9.9",
                           "content_id": vs.content_id, "attestations": {"package": envelope}})
    with pytest.raises(RefusedError, match="fixed at its approval"):
        run("bot", lambda s: Plan(entries=[entry]), actor=who["tina"])
    assert _snapshot() == before


def test_an_approval_fixes_the_gguf_and_a_later_package_needs_a_new_approval(reg):
    from registry.audit import model_state
    from registry.integrity import packaged_gguf
    from registry.release import decide, promote, request
    from registry.testing import gate_evidence

    who = reg["who"]
    _package(who, "2", "b" * 64)
    gate_evidence("bot", "2", champion=("1", _champion_content()))
    request(who["tina"], "bot", "2", "production", "ready")
    approval = decide(who["alice"], "bot", "2", "fine", approve=True)
    assert approval.evidence["gguf"]["sha256"] == "b" * 64
    _package(who, "2", "c" * 64)  # after the approval: the candidate's newest package is not the approved one
    with pytest.raises(RefusedError, match="packaged again after its approval"):
        promote(who["bob"], "bot", "2", "production")
    content = model_state("bot").versions["2"].content_id
    assert packaged_gguf(content, "q8_0")["sha256"] == "c" * 64  # a candidate serves its newest package


def test_an_approval_fixes_only_the_gguf_its_eval_served(reg):
    from mlops.lineage import Tag
    from mlops.run_store import get_run
    from registry.release import decide, request
    from registry.testing import attest_eval_run, gate_evidence

    who = reg["who"]
    gate_run = gate_evidence("bot", "2", champion=("1", _champion_content()))
    eval_run = get_run(gate_run).data.tags[Tag.EVAL_RUN]
    # The eval served no package (a local conversion); a package signed after it was never judged in release form.
    attest_eval_run("bot", "2", eval_run, {"status": "checked", "offending": []}, "alice", gguf=None)
    _package(who, "2", "d" * 64)
    request(who["tina"], "bot", "2", "production", "ready")
    before = _snapshot()
    with pytest.raises(RefusedError, match="fixes GGUF dddddddddddd for serving, but the eval it stands on"):
        decide(who["alice"], "bot", "2", "fine", approve=True)
    assert _snapshot() == before
    # The eval re-run on the packaged GGUF: the approval fixes it.
    attest_eval_run("bot", "2", eval_run, {"status": "checked", "offending": []}, "alice",
                    gguf={"sha256": "d" * 64, "quantization": "q8_0"})
    assert decide(who["alice"], "bot", "2", "fine", approve=True).evidence["gguf"]["sha256"] == "d" * 64


def test_a_gguf_from_another_llamacpp_version_is_a_clear_error_never_a_skipped_check(monkeypatch, tmp_path):
    from serving.engines.llamacpp import artifact

    target = tmp_path / "model-q8_0.gguf"
    target.write_bytes(b"gguf")
    monkeypatch.setattr(artifact, "packaged_record", lambda *_a: {
        "sha256": "0" * 64, "llamacpp_version": "0.3.36", "model": "bot", "version": "2", "seq": 9})
    with pytest.raises(artifact.PackageMismatch, match="made by llama.cpp 0.3.36.*comes from llama.cpp 0.4.0"):
        artifact.check_packaged(target, tmp_path, "q8_0", "0.4.0")
    with pytest.raises(artifact.PackageMismatch, match="has sha256"):
        artifact.check_packaged(target, tmp_path, "q8_0", "0.3.36")


# --------------------------------------------------------------------------- the statements themselves


def test_an_attestation_is_an_in_toto_statement_in_a_dsse_envelope_signed_by_its_runner(reg):
    import base64

    from registry.attest_store import stored
    from registry.attestation import AttestationProblem, open_envelope
    from registry.audit import model_state
    from registry.derive import attestors_of

    state = model_state("bot")
    vs = state.versions["1"]
    envelope = stored("gate", vs.evidence["files_digest"])[0]
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert {s["name"]: s["digest"]["sha256"] for s in statement["subject"]} == vs.evidence["files"]
    att = open_envelope(envelope, state.users, attestors_of(state.policy), "gate")
    assert att.signer == "alice" and att.predicate["result"] == "passed"
    tampered = {**envelope, "payload": base64.b64encode(json.dumps(
        {**statement, "predicate": {**statement["predicate"], "result": "failed"}}).encode()).decode()}
    with pytest.raises(AttestationProblem, match="signature is not alice's"):
        open_envelope(tampered, state.users, attestors_of(state.policy), "gate")
    with pytest.raises(AttestationProblem, match="not urn:mlops:attestation:eval:v1"):
        open_envelope(envelope, state.users, attestors_of(state.policy), "eval")


def test_the_cli_refuses_an_unattested_run_and_only_an_admin_may_override(reg):
    from registry.testing import as_user, run_cli, training_run

    anonymous = training_run(reg["hf"], tmp=reg["tmp"] / "cli", variant=11, trainer=None)
    before = _snapshot()
    code, _, err = run_cli("registry", "register", "--run", anonymous, "--name", "bot", env=as_user("tina"))
    assert code == 2 and "has no training attestation" in err and "--unattested-reason" in err, err
    code, _, err = run_cli("registry", "register", "--run", anonymous, "--name", "bot", "--unattested-reason",
                           "trust me", env=as_user("tina"))
    assert code == 3 and "may not override" in err, err
    assert _snapshot() == before
    code, out, err = run_cli("registry", "register", "--run", anonymous, "--name", "bot", "--unattested-reason",
                             "trained before attestations", "--json", env=as_user("admin"))
    assert code == 0 and json.loads(out)["stage"] == "candidate", err


def test_an_attestation_row_written_by_sql_without_a_permitted_signature_is_no_evidence(reg):
    import base64

    import sqlalchemy as sa

    from registry import ledger
    from registry.attest_store import TABLE, usable
    from registry.attestation import statement
    from registry.audit import model_state
    from registry.derive import attestors_of

    state = model_state("bot")
    vs = state.versions["2"]
    stmt = statement("gate", vs.evidence["files"], {"result": "passed", "gate_run": "x", "eval_run": "y",
                                                    "champion": {"content_id": state.versions["1"].content_id}})
    fingerprint = reg["who"]["alice"].signer.fingerprint  # alice's keyid, but not alice's signature
    forged = {"payload": base64.b64encode(json.dumps(stmt).encode()).decode(),
              "payloadType": "application/vnd.in-toto+json",
              "signatures": [{"keyid": fingerprint, "sig": base64.b64encode(b"\0" * 64).decode()}]}
    with ledger.engine().begin() as conn:
        conn.execute(TABLE.insert().values(id="f" * 64, kind="gate", subject_key=vs.evidence["files_digest"],
                                           signer="alice", created="9999-01-01T00:00:00Z",
                                           envelope=json.dumps(forged)))
        assert conn.execute(sa.select(sa.func.count()).select_from(TABLE)).scalar() > 0
    assert list(usable("gate", vs.evidence["files_digest"], state.users, attestors_of(state.policy))) == []


def test_an_admin_cannot_switch_the_evidence_rules_off_with_a_policy_that_names_no_attestors(reg):
    from registry.config import recorded_policy
    from registry.ledger import verified
    from registry.transition import Plan, run

    policy = {k: v for k, v in recorded_policy(verified().entries).items() if k != "attestors"}
    entry = dict(actor="admin", action="policy", model="(registry)", reason="back to trusting claims",
                 evidence={"policy": policy})
    before = _snapshot()
    with pytest.raises(RefusedError, match="would switch off the evidence rules"):
        run("(registry)", lambda s: Plan(entries=[entry]), actor=reg["who"]["admin"])
    assert _snapshot() == before
