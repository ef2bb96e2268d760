"""Faults between the writes of an act, on SQLite and PostgreSQL: the registry and the ledger agree afterwards, the
CLI prints one paragraph and exits 2, and a retry succeeds. And registrations that race each other all land."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.testing import as_user, run_cli


@pytest.fixture
def ready(store, tiny_model, tmp_path):
    """v1 in production; v2 approved for production with passing gate evidence: `promote bot 2` is next."""
    from registry.release import decide
    from registry.testing import challenger_requested

    who = challenger_requested(Path(tiny_model["path"]), tmp=tmp_path, comment="ready")
    decide(who["alice"], "bot", "2", "fine", approve=True)
    return store


def ledger_says() -> str | None:
    from registry.audit import model_state

    return model_state("bot").aliases.get("production")


def mlflow_says() -> str | None:
    from registry.transition import registry_aliases

    return registry_aliases("bot").get("production")


def promote_cli() -> tuple[int, str, str]:
    return run_cli("registry", "promote", "bot", "2", "--to", "production", env=as_user("bob"))


def one_paragraph(err: str) -> bool:
    return "Traceback" not in err and err.startswith("error: ") and err.strip().count("\n") == 0


def test_a_ledger_write_that_fails_changes_nothing_and_a_retry_succeeds(ready, monkeypatch):
    import sqlalchemy as sa

    from registry import ledger

    real = ledger.append

    def failing(chain, signer, **values):
        raise sa.exc.OperationalError("INSERT INTO mlops_ledger", {}, Exception("disk I/O error"))

    monkeypatch.setattr(ledger, "append", failing)
    code, _, err = promote_cli()
    assert code == 2 and one_paragraph(err) and "Nothing was changed" in err, err
    assert ledger_says() == mlflow_says() == "1"
    monkeypatch.setattr(ledger, "append", real)
    assert promote_cli()[0] == 0
    assert ledger_says() == mlflow_says() == "2"


def _lose_store_after_commit(monkeypatch, url: str | None):
    """The store goes away between the ledger commit and MLflow's alias writes (PostgreSQL: connections refused
    for real; SQLite: the writes fail) and stays away until `state["up"]()` brings it back."""
    from registry import transition

    real = transition._move_aliases
    state = {"down": None}

    def outage(model, moves, **kwargs):
        if state["down"] is None:  # the first display write of the act: the store goes away now
            state["down"] = True
            if url is not None:
                _refuse_connections(url, True)
        if state["down"] and url is None:
            raise transition.MLOpsError("the tracking store is unavailable (sqlite: disk I/O error)")
        return real(model, moves, **kwargs)

    def up():
        state["down"] = False
        if url is not None:
            _refuse_connections(url, False)

    state["up"] = up
    monkeypatch.setattr(transition, "_move_aliases", outage)
    return state


def _refuse_connections(url: str, refuse: bool) -> None:
    import psycopg

    from tests.conftest import PG_ADMIN

    name = url.rsplit("/", 1)[-1]
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {"false" if refuse else "true"}')
        if refuse:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                          "AND pid <> pg_backend_pid()", (name,))


def test_a_store_lost_after_the_ledger_commit_leaves_the_act_in_force_and_the_retry_repairs_mlflow(ready,
                                                                                                   monkeypatch):
    from mlops.model_refs import describe

    state = _lose_store_after_commit(monkeypatch, ready)
    try:
        code, _, err = promote_cli()
    finally:
        state["up"]()
    assert code == 2 and one_paragraph(err) and "is in force" in err, err
    assert ledger_says() == "2" and describe("models:/bot@production").version == "2"  # consumers obey the ledger
    assert "DRIFT" in run_cli("registry", "status", "bot")[1]
    code, out, err = promote_cli()  # the same command again: nothing new is ledgered, the copy is rewritten
    assert code == 4 and out.startswith("already in force: version 2"), (out, err)  # done before, not now
    assert ledger_says() == mlflow_says() == "2"
    code, out, _ = run_cli("registry", "verify", "bot")
    assert code == 0, out


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_a_locked_store_is_refused_cleanly_and_a_retry_succeeds(ready, monkeypatch):
    from registry import ledger

    monkeypatch.setenv("MLOPS_SQLITE_BUSY_TIMEOUT", "1")
    monkeypatch.setenv("MLOPS_REGISTRY_LOCK_TIMEOUT", "1")
    db = ledger.ledger_url()
    holder = _hold_lock(db)
    try:
        code, _, err = promote_cli()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert code == 2 and one_paragraph(err) and ("locked" in err or "lock" in err), err
    assert ledger_says() == mlflow_says() == "1"
    assert promote_cli()[0] == 0 and ledger_says() == mlflow_says() == "2"


HOLD = """
import sys, time
url = sys.argv[1]
if url.startswith("sqlite"):
    import sqlite3
    conn = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
else:
    import psycopg
    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    conn.execute("SELECT pg_advisory_lock(%s)" % sys.argv[2])
print("held", flush=True)
sys.stdin.read()
"""


def _hold_lock(db: str) -> subprocess.Popen:
    from registry.transition import PG_LOCK_KEY

    proc = subprocess.Popen([sys.executable, "-c", HOLD, db, str(PG_LOCK_KEY)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


REGISTER = """
import json, sys
from registry.release import register
from registry.testing import signed_in
print(json.dumps({"run": sys.argv[1], "version": register(signed_in("tina"), sys.argv[1], "bot")}))
"""


@pytest.mark.slow
def test_twenty_registrations_at_once_all_land_with_one_entry_each(store, tiny_model, tmp_path):
    from mlops.tracking import init_experiment
    from registry import ledger
    from registry.testing import data_run, make_identities, training_run

    init_experiment("registry-test")
    make_identities()
    snapshot = data_run()
    runs = [training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=i, data_run_id=snapshot) for i in range(20)]
    runs += runs[:2]  # two of them twice: a registration is idempotent on its run id
    env = {**os.environ, "MLFLOW_SQLALCHEMYSTORE_POOL_SIZE": "1", "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": "2"}
    procs = [subprocess.Popen([sys.executable, "-c", REGISTER, run_id], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for run_id in runs]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outcomes.append(json.loads(out.strip().splitlines()[-1]))
    registered = [e for e in ledger.entries("bot") if e.action == "register"]
    assert sorted(e.evidence["run_id"] for e in registered) == sorted(set(runs))
    by_run = {o["run"]: o["version"] for o in outcomes}
    assert len(set(by_run.values())) == 20 and all(by_run[o["run"]] == o["version"] for o in outcomes)
