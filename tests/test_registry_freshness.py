"""Freshness: with registry.freshness.hours set, a verifier needs a signed, unexpired timestamp over a head its
ledger holds, never older than one it saw, so a replica that pins only the root refuses a ledger frozen at an
older head; and the files a verifier keeps (root pin, anchor, seen timestamp) are its user's alone."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from registry.testing import as_user, run_cli

HOURS = 2.0
NEW_PASS = "Quiet-Harbor-Lamp-2026"


@pytest.fixture
def who(mlops_home):
    from registry.testing import make_identities

    return make_identities()


@pytest.fixture
def any_who(store, mlops_home):
    """`who` on each store in turn (SQLite, then PostgreSQL): freezing a ledger is a database writer's attack."""
    from registry.testing import make_identities

    return make_identities()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _enforce(who, tmp_path: Path, hours: float | None = HOURS, roles: tuple[str, ...] = ("admin",)) -> None:
    from registry.identities import set_policy

    path = tmp_path / f"policy-{hours}-{'-'.join(roles)}.yaml"
    path.write_text("registry:\n  freshness:\n" + ("" if hours is None else f"    hours: {hours}\n")
                    + "    signer_roles: [" + ", ".join(roles) + "]\n")
    set_policy(who["admin"], path)


def _stamp(name: str = "admin") -> tuple[int, str, str]:
    code, out, err = run_cli("registry", "timestamp", env=as_user(name))
    return code, out, err


def _clock(monkeypatch, seconds: float) -> None:
    from registry import freshness

    monkeypatch.setattr(freshness, "_now", lambda: seconds)


def _rows() -> list[dict]:
    import sqlalchemy as sa

    from registry import freshness, ledger

    t = freshness.table()
    with ledger.engine().connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(t).order_by(t.c.id)).mappings()]


def _write_rows(rows: list[dict]) -> None:
    """What a database writer does: replace the stored timestamps with `rows`."""
    from registry import freshness, ledger

    t = freshness.table()
    with ledger.engine().begin() as conn:
        conn.execute(t.delete())
        for row in rows:
            conn.execute(t.insert().values(**{k: v for k, v in row.items() if k != "id"}))


def _fresh_replica(folder: Path, monkeypatch, root: str) -> None:
    """A replica started fresh: it pins only the root (no MLOPS_TRUST_HEAD, no anchor, no timestamp seen)."""
    from registry import ledger, trust

    folder.mkdir()
    monkeypatch.setenv("MLOPS_LEDGER_KEY_DIR", str(folder))
    monkeypatch.setenv(trust.ROOT_ENV, root)
    monkeypatch.delenv(trust.HEAD_ENV, raising=False)
    ledger._AUDITED.clear()
    trust._MEMORY.clear()


# --------------------------------------------------------------------------- files mode 600


def test_the_root_pin_the_anchor_and_the_seen_timestamp_are_written_mode_600_in_a_mode_700_folder(mlops_home):
    from registry import ledger, trust
    from registry.signing import key_dir
    from registry.testing import make_identities

    old = os.umask(0)  # even under a permissive umask
    try:
        make_identities()
        chain = ledger.verified()
        pin, anchor = trust.root_pin_path(chain.registry_id), trust.anchor_path(chain.registry_id)
        assert (_mode(pin), _mode(anchor), _mode(key_dir())) == (0o600, 0o600, 0o700)
        anchor.unlink()
        trust._MEMORY.clear()
        ledger.verified()  # a verified read writes the anchor again
        assert _mode(anchor) == 0o600
        assert _stamp()[0] == 0
        assert _mode(trust.timestamp_path(chain.registry_id)) == 0o600
    finally:
        os.umask(old)
    assert not list(key_dir().glob("*.tmp")) and not list(key_dir().glob(".*.tmp"))


# --------------------------------------------------------------------------- freshness off


def test_with_freshness_unset_reads_and_acts_never_look_at_timestamps(who, monkeypatch):
    from registry import freshness, ledger
    from registry.identities import add_user

    def no_read(url=None):
        raise AssertionError("a timestamp was read while freshness is off")

    monkeypatch.setattr(freshness, "newest", no_read)
    chain = ledger.verified()
    assert ledger.problems_of(chain) == []
    add_user(who["admin"], "grace", "viewer", NEW_PASS)
    assert run_cli("registry", "user", "list")[0] == 0


def test_a_timestamp_is_no_ledger_entry_and_its_signer_needs_an_allowed_role(who):
    from registry import ledger

    before = ledger.verified()
    code, out, err = _stamp("tina")
    assert code == 3 and "role 'trainer'" in err and "mlops registry timestamp" in err, err
    assert _rows() == []  # refused: nothing signed, nothing written
    code, out, err = _stamp("admin")
    assert code == 0 and "not enforced yet" in out, err
    after = ledger.verified()
    assert (after.head_seq, after.head_hash) == (before.head_seq, before.head_hash)
    assert [r["head_seq"] for r in _rows()] == [before.head_seq]


# --------------------------------------------------------------------------- freshness on


def test_with_freshness_set_a_read_without_a_timestamp_is_refused_naming_the_command(who, tmp_path):
    from registry import ledger
    from registry.freshness import StaleLedger
    from registry.identities import add_user

    _enforce(who, tmp_path)
    with pytest.raises(StaleLedger, match=r"no signed timestamp.*`mlops registry timestamp` as an identity of role "
                                          r"admin"):
        ledger.verified()
    with pytest.raises(StaleLedger):
        add_user(who["admin"], "grace", "viewer", NEW_PASS)  # a writer verifies too
    code, _, err = run_cli("registry", "user", "list")
    assert code == 2 and "mlops registry timestamp" in err
    code, out, err = _stamp()  # signing in and reading do not need the timestamp it renews
    assert code == 0 and "valid until" in out, err
    ledger.verified()
    add_user(who["admin"], "grace", "viewer", NEW_PASS)
    assert run_cli("registry", "user", "list")[0] == 0


def test_an_expired_timestamp_stops_reads_and_acts_until_it_is_signed_again(who, tmp_path, monkeypatch):
    import time

    from registry import ledger
    from registry.freshness import StaleLedger
    from registry.identities import add_user

    _stamp()
    _enforce(who, tmp_path)
    now = time.time()
    _clock(monkeypatch, now + HOURS * 3600 - 60)
    ledger.verified()
    _clock(monkeypatch, now + HOURS * 3600 + 60)
    with pytest.raises(StaleLedger, match="expired at"):
        ledger.verified()
    with pytest.raises(StaleLedger, match="expired at"):
        add_user(who["admin"], "grace", "viewer", NEW_PASS)
    assert _stamp()[0] == 0
    ledger.verified()


def test_a_timestamp_longer_than_the_policy_allows_expires_at_the_policy_s_hours(who, tmp_path, monkeypatch):
    import time

    from registry import ledger
    from registry.freshness import DEFAULT_HOURS, StaleLedger

    _stamp()  # signed before the policy set hours: valid DEFAULT_HOURS
    _enforce(who, tmp_path, hours=1)
    assert DEFAULT_HOURS > 1
    _clock(monkeypatch, time.time() + 2 * 3600)
    with pytest.raises(StaleLedger, match="expired"):
        ledger.verified()


def test_a_forged_timestamp_or_one_signed_by_a_role_not_allowed_is_refused(who, tmp_path):
    from registry import freshness, ledger
    from registry.freshness import StaleLedger

    _enforce(who, tmp_path)
    assert _stamp()[0] == 0
    good = _rows()[-1]
    _write_rows([{**good, "expires": "2999-01-01T00:00:00.000000Z"}])  # edited, not re-signed
    with pytest.raises(StaleLedger, match="does not carry admin's signature"):
        ledger.verified()
    by_tina = {**good, "signer": "tina", "issued": freshness.iso(freshness._now())}
    by_tina["signature"] = who["tina"].signer.sign(freshness.statement(by_tina))  # her own key, a wrong role
    _write_rows([by_tina])
    with pytest.raises(StaleLedger, match="of role trainer; registry.freshness.signer_roles allows admin"):
        ledger.verified()
    _write_rows([{**good, "registry_id": "0" * 32}])
    with pytest.raises(StaleLedger, match="not this one"):
        ledger.verified()


def test_a_role_the_policy_names_may_sign_timestamps(who, tmp_path):
    from registry import ledger

    _stamp()
    _enforce(who, tmp_path, roles=("admin", "approver"))
    code, _, err = _stamp("alice")
    assert code == 0, err
    assert _rows()[-1]["signer"] == "alice"
    ledger.verified()


def test_a_timestamp_older_than_one_this_machine_saw_is_refused(who, tmp_path, monkeypatch):
    import time

    from registry import ledger
    from registry.freshness import StaleLedger

    _enforce(who, tmp_path)
    now = time.time()
    _clock(monkeypatch, now)
    assert _stamp()[0] == 0
    _clock(monkeypatch, now + 60)
    assert _stamp()[0] == 0
    ledger.verified()  # this machine saw the newer one
    older, _newer = _rows()
    _write_rows([older])  # written back: still unexpired, over a head the ledger holds
    with pytest.raises(StaleLedger, match="older than the timestamp this machine verified before"):
        ledger.verified()


def test_a_replica_pinning_only_the_root_refuses_a_ledger_cut_back_once_its_timestamp_expired(any_who, tmp_path,
                                                                                              monkeypatch):
    import time

    import sqlalchemy as sa

    from registry import ledger
    from registry.freshness import StaleLedger
    from registry.identities import add_user, remove_user

    who = any_who
    _enforce(who, tmp_path)
    now = time.time()
    _clock(monkeypatch, now)
    assert _stamp()[0] == 0
    frozen = ledger.verified()
    old_stamp = _rows()[-1]
    remove_user(who["admin"], "bob")  # e.g. a revocation the attacker wants replicas never to see
    add_user(who["admin"], "grace", "viewer", NEW_PASS)
    _clock(monkeypatch, now + 600)
    assert _stamp()[0] == 0
    root = frozen.root

    # A database writer cuts the ledger back to the frozen head and writes back the timestamp over it.
    keep = frozen.entries[-1]
    with ledger.engine().begin() as conn:
        conn.execute(sa.text(f"DELETE FROM mlops_ledger WHERE seq > {keep.seq}"))
        conn.execute(sa.text(f"UPDATE mlops_ledger_head SET seq = {keep.seq}, hash = '{keep.hash}'"))
    _write_rows([old_stamp])

    _fresh_replica(tmp_path / "replica-1", monkeypatch, root)
    ledger.verified()  # within the old timestamp's validity a freeze goes unnoticed: the window is `hours`
    _clock(monkeypatch, now + HOURS * 3600 + 1)
    _fresh_replica(tmp_path / "replica-2", monkeypatch, root)
    with pytest.raises(StaleLedger, match="expired at .* may be a frozen older copy"):
        ledger.verified()
    code, _, err = run_cli("registry", "user", "list")
    assert code == 2 and "mlops registry timestamp" in err


def test_a_timestamp_over_a_head_the_ledger_does_not_hold_is_refused(who, tmp_path):
    from registry import freshness, ledger
    from registry.freshness import StaleLedger

    _enforce(who, tmp_path)
    assert _stamp()[0] == 0
    good = _rows()[-1]
    ahead = {**good, "head_seq": good["head_seq"] + 5, "issued": freshness.iso(freshness._now())}
    ahead["signature"] = who["admin"].signer.sign(freshness.statement(ahead))
    _write_rows([ahead])
    with pytest.raises(StaleLedger, match="vouches for a head this ledger does not hold"):
        ledger.verified()
