"""Key passphrases: a weak one is refused at bootstrap, user add and passwd (library and CLI) naming the rule and
writing nothing; a key file records the argon2id cost it was sealed at, and one sealed below the floor is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlops.errors import MLOpsError
from mlops.identities import check_password
from registry.testing import PASSWORDS, as_user, run_cli

STRONG = "Harbour-Lights-2026"  # what a new identity in these tests is sealed under: it passes every rule


@pytest.mark.parametrize("passphrase,rule", [
    ("Short-1!", "shorter than 12 characters"),
    ("Carol-Approves-2026", "contains the user name 'carol'"),
    ("zzzzzzzzzzzzzzzzzzzzzz", "one character or a short pattern repeated"),
    ("Ab1-Ab1-Ab1-Ab1-", "one character or a short pattern repeated"),
    ("Abcdefghijkl-9", "mostly a simple run"),
    ("Qwertyuiop-12", "mostly a simple run"),
    ("harbourlightsatdusk", "mixes only 1 of the 4 kinds"),
])
def test_a_weak_passphrase_is_refused_naming_the_rule_and_the_fix_without_echoing_it(passphrase, rule):
    with pytest.raises(MLOpsError, match=rule) as refused:
        check_password(passphrase, name="carol")
    assert "Fix: choose a passphrase of 12+ characters" in str(refused.value)
    assert passphrase not in str(refused.value)


@pytest.mark.parametrize("passphrase", [STRONG, "harbour lights at dusk again", *PASSWORDS.values()])
def test_a_long_or_mixed_passphrase_without_the_name_is_accepted(passphrase):
    check_password(passphrase, name="carol")


def _nothing_under(folder: Path) -> bool:
    return not folder.exists() or not any(folder.rglob("*"))


def test_bootstrap_with_a_weak_passphrase_creates_no_registry_and_no_key(mlops_home, tmp_path):
    from registry.identities import bootstrap

    with pytest.raises(MLOpsError, match="shorter than 12 characters"):
        bootstrap("admin", "admin-pass", policy={})
    code, _, err = run_cli("registry", "bootstrap", "--admin", "admin", env={"MLOPS_NEW_PASSWORD": "Admin-Key-2026"})
    assert code == 2 and "contains the user name 'admin'" in err and "Admin-Key-2026" not in err, err
    assert _nothing_under(tmp_path / "ledger-keys")
    assert not (mlops_home / ".mlops" / "mlflow.db").exists()


@pytest.fixture
def admin_only(mlops_home, tmp_path):
    """A registry with its first admin and nobody else; returns the admin's identity."""
    from registry.identities import bootstrap
    from registry.testing import signed_in

    bootstrap("admin", PASSWORDS["admin"], policy={})
    return signed_in("admin")


def _key_of(name: str) -> Path:
    from registry.ledger import verified
    from registry.signing import user_key_path

    return user_key_path(verified().registry_id, name)


def test_user_add_with_a_weak_passphrase_writes_no_entry_and_no_key(admin_only):
    from registry import ledger
    from registry.identities import add_user

    before = len(ledger.entries())
    with pytest.raises(MLOpsError, match="contains the user name 'carol'"):
        add_user(admin_only, "carol", "approver", "Carol-Approves-2026")
    code, _, err = run_cli("registry", "user", "add", "carol", "--role", "approver",
                           env={**as_user("admin"), "MLOPS_NEW_PASSWORD": "approver1"})
    assert code == 2 and "shorter than 12 characters" in err and "approver1" not in err, err
    assert len(ledger.entries()) == before and not _key_of("carol").exists()


def test_user_add_with_a_strong_passphrase_gives_a_key_that_signs_in(admin_only):
    from mlops.identities import authenticate

    code, out, err = run_cli("registry", "user", "add", "carol", "--role", "approver",
                             env={**as_user("admin"), "MLOPS_NEW_PASSWORD": STRONG})
    assert code == 0, err
    assert authenticate("carol", STRONG).role == "approver"


def test_passwd_with_a_weak_passphrase_keeps_the_old_key_and_writes_nothing(admin_only):
    from registry import ledger
    from registry.identities import set_password

    key, before = _key_of("admin"), len(ledger.entries())
    sealed = key.read_bytes()
    with pytest.raises(MLOpsError, match="mixes only 1 of the 4 kinds"):
        set_password(admin_only, "admin", "lowercaseletters")
    code, _, err = run_cli("registry", "user", "passwd", "admin",
                           env={**as_user("admin"), "MLOPS_NEW_PASSWORD": "aaaaaaaaaaaaaaaaaaaaaaaa"})
    assert code == 2 and "short pattern repeated" in err, err
    assert key.read_bytes() == sealed and len(ledger.entries()) == before


def test_key_new_with_a_weak_passphrase_writes_no_key_file(tmp_path):
    out = tmp_path / "mine.key"
    code, _, err = run_cli("registry", "key", "new", "carol", "--out", str(out),
                           env={"MLOPS_NEW_PASSWORD": "Qwertyuiop-12"})
    assert code == 2 and "mostly a simple run" in err, err
    assert not out.exists()


# --------------------------------------------------------------------------- the cost a key file is sealed at


def _sealed_at(tmp_path: Path, **cost: int) -> Path:
    """A key file for carol genuinely sealed at `cost` (over the current KDF), as an older release wrote it."""
    from registry import signing

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(signing, "KDF", {**signing.KDF, **cost})
        return signing.write_key_file(tmp_path / "carol.key", signing.new_signer("carol"), "reg-1", STRONG)


def test_a_key_file_records_the_argon2id_cost_it_was_sealed_at(tmp_path):
    from registry.signing import KDF

    recorded = json.loads(_sealed_at(tmp_path).read_text())["kdf"]
    assert recorded["name"] == "argon2id"
    assert {k: recorded[k] for k in ("time_cost", "memory_cost", "parallelism")} == KDF


def test_a_key_file_opens_at_the_cost_it_records_not_todays(tmp_path):
    from registry.signing import KDF, unlock

    path = _sealed_at(tmp_path, time_cost=KDF["time_cost"] + 1, parallelism=1)
    assert unlock(path, STRONG).name == "carol"


@pytest.mark.parametrize("cost,named", [({"memory_cost": 8192}, "memory_cost=8192"),
                                        ({"time_cost": 1}, "time_cost=1")])
def test_a_key_file_sealed_below_the_cost_floor_is_refused_with_the_rekey_fix(tmp_path, cost, named):
    from registry.signing import KeyFileError, unlock

    path = _sealed_at(tmp_path, **cost)
    with pytest.raises(KeyFileError, match="below the floor") as refused:
        unlock(path, STRONG)
    assert named in str(refused.value) and "mlops registry user passwd carol" in str(refused.value)
