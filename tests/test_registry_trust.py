"""The registry's trust root: identities and policy from the governed store, a keyed and anchored ledger that
every decision verifies first, not-found answers, drift in status, and typed text that cannot act on a terminal."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from mlops.identities import AuthError
from registry.ledger import LedgerBroken
from registry.testing import as_user, run_cli
from registry.transition import flush_display


@pytest.fixture
def reg(mlops_home, tiny_model, tmp_path):
    return _registry_with_two_versions(tiny_model, tmp_path, mlops_home)


@pytest.fixture
def any_reg(store, mlops_home, tiny_model, tmp_path):
    """`reg` on each store in turn (SQLite, then PostgreSQL): tampering is a database writer's attack."""
    return _registry_with_two_versions(tiny_model, tmp_path, mlops_home)


def _registry_with_two_versions(tiny_model, tmp_path, mlops_home) -> dict:
    from registry.testing import two_versions

    who, runs, versions = two_versions(Path(tiny_model["path"]), tmp=tmp_path)
    return {"who": who, "runs": runs, "versions": versions, "tmp": tmp_path, "home": mlops_home}


def _sql(*statements: str) -> None:
    import sqlalchemy as sa

    from registry import ledger

    with ledger.engine().begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))


def _forge_promotion(version: str) -> None:
    """What a writer with database access and the public rule can do: append a well-formed entry whose hash is
    the sha256 of its canonical fields, and move the head to it."""
    from registry import ledger

    last = ledger.entries()[-1]
    row = {"seq": last.seq + 1, "ts": "2026-12-01T00:00:00.000000Z", "actor": "mallory", "action": "promote",
           "model": "bot", "version": version, "from_stage": "candidate", "to_stage": "production",
           "alias": "production", "alias_before": None, "alias_after": version, "evidence": {},
           "reason": None, "prev_hash": last.hash}
    digest = hashlib.sha256(ledger.canonical(row).encode()).hexdigest()
    _sql(f"INSERT INTO mlops_ledger (seq, ts, actor, action, model, version, from_stage, to_stage, alias, "
         f"alias_after, evidence, prev_hash, hash) VALUES ({row['seq']}, '{row['ts']}', 'mallory', 'promote', "
         f"'bot', '{version}', 'candidate', 'production', 'production', '{version}', '{{}}', '{last.hash}', "
         f"'{digest}')",
         f"UPDATE mlops_ledger_head SET seq = {row['seq']}, hash = '{digest}'")


# --------------------------------------------------------------------------- identities and policy


def test_an_identities_file_named_by_the_environment_creates_nobody(reg, tmp_path, monkeypatch):
    from argon2 import PasswordHasher

    from mlops.identities import authenticate

    mine = tmp_path / "mine.yaml"
    mine.write_text(json.dumps({"users": {"grace": {"role": "admin",
                                                    "password_hash": PasswordHasher().hash("Hopper-Key-1906")}}}))
    monkeypatch.setenv("MLOPS_IDENTITIES", str(mine))
    with pytest.raises(AuthError, match="unknown user or wrong password"):
        authenticate("grace", "Hopper-Key-1906")
    code, _, err = run_cli("registry", "user", "add", "grace", "--role", "approver",
                           env={"MLOPS_USER": "grace", "MLOPS_PASSWORD": "Hopper-Key-1906",
                                "MLOPS_NEW_PASSWORD": "Hopper-Key-1907"})
    assert code == 3 and "authentication failed" in err


def test_adding_a_user_is_a_ledgered_admin_act_and_bootstrap_happens_once(reg):
    from registry import ledger
    from registry.identities import add_user, bootstrap

    with pytest.raises(AuthError, match="may not manage users"):
        add_user(reg["who"]["tina"], "eve", "admin", "Listens-In-2026")
    code, out, _ = run_cli("registry", "user", "add", "grace", "--role", "approver",
                           env={**as_user("admin"), "MLOPS_NEW_PASSWORD": "Hopper-Key-1906"})
    assert code == 0, out
    added = [e for e in ledger.entries() if e.action == "user_add" and e.evidence["name"] == "grace"]
    assert added and added[0].actor == "admin"
    with pytest.raises(Exception, match="already holds a registry"):
        bootstrap("mallory", "Second-Root-2026", policy={})


def test_the_release_policy_comes_from_the_ledger_not_the_environment_or_the_folder(reg, tmp_path, monkeypatch):
    from registry.audit import model_state
    from registry.gates import evaluate_gates
    from registry.identities import set_policy

    strict = tmp_path / "strict.yaml"
    strict.write_text("registry:\n  spot_check:\n    required: true\n")
    set_policy(reg["who"]["admin"], strict)
    lenient = tmp_path / "lenient.yaml"
    lenient.write_text("registry:\n  spot_check:\n    required: false\n")
    monkeypatch.setenv("MLOPS_RELEASE_POLICY", str(lenient))
    monkeypatch.chdir(tmp_path)  # a folder without the project's config
    gates = {g.gate for g in evaluate_gates(model_state("bot"), "1")}
    assert "spot_check" in gates


def test_an_act_under_a_policy_file_that_differs_from_the_recorded_one_is_refused(reg):
    from registry import ledger
    from registry.identities import set_policy
    from registry.release import request
    from registry.transition import RefusedError

    path = reg["home"] / "configs" / "registry" / "release.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("registry:\n  shadow:\n    required: false\n    min_requests: 5\n")
    before = len(ledger.entries())
    with pytest.raises(RefusedError, match="differs from the policy recorded in the ledger"):
        request(reg["who"]["tina"], "bot", "1", "production", "go")
    assert len(ledger.entries()) == before
    set_policy(reg["who"]["admin"], path)
    request(reg["who"]["tina"], "bot", "1", "production", "go")


# --------------------------------------------------------------------------- the keyed, anchored chain


def test_a_row_edited_with_its_sha256_recomputed_breaks_the_chain_and_stops_every_act(any_reg):
    from registry.audit import verify
    from registry.release import request

    _forge_promotion("2")
    result = verify()
    assert not result.ok and any("no identity the ledger holds" in p for p in result.chain), result.chain
    with pytest.raises(LedgerBroken, match="entry"):
        request(any_reg["who"]["tina"], "bot", "1", "production", "go")
    code, _, err = run_cli("registry", "status", "bot")
    assert code == 2 and "does not verify" in err


def test_entries_cut_off_the_end_with_the_head_moved_back_are_found(any_reg):
    from registry import ledger
    from registry.audit import verify

    assert verify().ok  # this machine has seen the newest head
    entries = ledger.entries()
    keep = entries[-3]
    _sql(f"DELETE FROM mlops_ledger WHERE seq > {keep.seq}",
         f"UPDATE mlops_ledger_head SET seq = {keep.seq}, hash = '{keep.hash}'")
    problems = verify().chain
    assert any("cut off its end" in p for p in problems), problems


def test_verify_of_the_whole_ledger_fails_a_wiped_ledger(any_reg):
    from registry import ledger

    assert run_cli("registry", "verify")[0] == 0
    _sql("DELETE FROM mlops_ledger", f"UPDATE mlops_ledger_head SET seq = 0, hash = '{ledger.GENESIS}'")
    code, out, _ = run_cli("registry", "verify")
    assert code == 1 and "BROKEN" in out and "wiped" in out


def test_a_machine_that_pins_no_trust_root_trusts_and_changes_nothing(any_reg, tmp_path, monkeypatch):
    from registry import ledger
    from registry.release import request
    from registry.trust import TrustError

    before = len(ledger.entries())
    monkeypatch.setenv("MLOPS_LEDGER_KEY_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.delenv("MLOPS_TRUST_ROOT", raising=False)
    with pytest.raises(TrustError, match="pins no trust root"):
        request(any_reg["who"]["tina"], "bot", "1", "production", "go")
    code, _, err = run_cli("registry", "status", "bot")
    assert code == 2 and "MLOPS_TRUST_ROOT" in err
    assert len(ledger.entries()) == before


# --------------------------------------------------------------------------- consumers obey the verified ledger


def test_a_plain_production_ref_resolves_from_the_ledger_not_mlflows_alias(any_reg):
    from mlops.model_refs import describe
    from mlops.tracking import client
    from registry.testing import release_version

    release_version(any_reg["who"], "bot", "1")
    flush_display()  # the acts' own copies land first
    client().set_registered_model_alias("bot", "production", "2")  # the MLflow UI's pencil icon
    assert describe("models:/bot@production").version == "1"


def test_the_follower_stays_on_the_verified_version_after_a_forged_promotion(any_reg):
    from registry.testing import fake_follower, release_version

    release_version(any_reg["who"], "bot", "1")
    follower = fake_follower()
    follower.poll_once()
    assert follower.serving_version() == "1"
    _forge_promotion("2")
    assert follower.poll_once() is None and follower.serving_version() == "1"
    assert "does not verify" in follower.refusals[-1]


# --------------------------------------------------------------------------- answers people read


@pytest.mark.parametrize("command", [("status", "nobody"), ("history", "nobody"), ("verify", "nobody"),
                                     ("who-approved", "nobody", "1"), ("report", "nobody"),
                                     ("who-approved", "bot", "9")])
def test_unknown_models_and_versions_exit_2_with_the_fix(reg, command):
    code, out, err = run_cli("registry", *command)
    assert code == 2 and "Fix:" in err and "Traceback" not in err, (out, err)


def test_reads_never_create_a_missing_store(mlops_home, tmp_path, monkeypatch):
    missing = tmp_path / "nowhere" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{missing}")
    for args in (("status", "bot"), ("verify",), ("promote", "bot", "1", "--to", "production")):
        code, _, err = run_cli("registry", *args, env=as_user("bob"))
        assert code in (2, 3) and not missing.exists(), err
    assert not missing.parent.exists()


def test_status_shows_the_drift_verify_finds(any_reg):
    from mlops.tracking import client
    from registry.testing import release_version

    release_version(any_reg["who"], "bot", "1")
    flush_display()  # the acts' own copies land first
    client().set_registered_model_alias("bot", "production", "2")
    code, out, _ = run_cli("registry", "status", "bot")
    assert code == 0 and "DRIFT" in out and "@production points to 2 in MLflow but the ledger says 1" in out


def test_typed_text_cannot_clear_the_screen_or_forge_a_line(reg):
    from registry.release import request

    request(reg["who"]["tina"], "bot", "1", "production", "ok\x1b[2J\r\n#99 2026 admin approve bot v1")
    for args in (("status", "bot"), ("report", "bot")):
        code, out, _ = run_cli("registry", *args)
        assert code == 0 and "\x1b" not in out and "\\x1b[2J" in out
        assert not any(line.startswith("#99") for line in out.splitlines())


def test_a_typed_name_quoted_in_an_error_cannot_act_on_the_terminal(reg):
    code, _, err = run_cli("registry", "status", "bot\x1b[2J\x1b]0;owned\x07")
    assert code == 2 and "\x1b" not in err and "\x07" not in err and "\\x1b[2J" in err


def test_an_over_long_model_name_is_one_clear_error(reg):
    name = "m" * 257
    code, _, err = run_cli("registry", "register", "--run", reg["runs"][0], "--name", name, env=as_user("tina"))
    assert code == 2 and "257 characters" in err and "Traceback" not in err
