"""Compare-and-set under real concurrency: processes promoting different versions at once, one winner."""

from __future__ import annotations

from pathlib import Path

import pytest


def _setup(tiny_model, tmp_path, n: int) -> list[str]:
    from mlops.tracking import init_experiment
    from registry.release import register
    from registry.testing import make_identities, training_run

    init_experiment("registry-test")
    who = make_identities()
    runs = [training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=i) for i in range(n)]
    return [register(who["tina"], run_id, "bot") for run_id in runs]


def _check_one_winner(outcomes: list[dict]) -> str:
    from registry.audit import verify
    from registry.transition import registry_aliases

    winners = [o["version"] for o in outcomes if o["won"]]
    assert len(winners) == 1, outcomes
    losers = [o for o in outcomes if not o["won"]]
    assert all(f"moved from nothing to {winners[0]} since you loaded it" in o["why"] for o in losers), losers
    assert registry_aliases("bot") == {"staging": winners[0]}
    assert verify("bot").ok
    return winners[0]


@pytest.mark.slow
def test_concurrent_promotions_on_sqlite_have_exactly_one_winner(mlops_home, tiny_model, tmp_path):
    from registry import ledger
    from registry.testing import race

    versions = _setup(tiny_model, tmp_path, 6)
    winner = _check_one_winner(race("bot", versions, "staging"))
    promotes = [e for e in ledger.entries("bot") if e.action == "promote"]
    assert [(e.version, e.alias_before, e.alias_after) for e in promotes] == [(winner, None, winner)]


@pytest.mark.slow
@pytest.mark.postgres
def test_concurrent_promotions_on_postgresql_have_exactly_one_winner(mlops_home, tiny_model, tmp_path,
                                                                     postgres_url, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", postgres_url)
    versions = _setup(tiny_model, tmp_path, 6)
    from registry.testing import race

    _check_one_winner(race("bot", versions, "staging"))


def test_threads_promoting_at_once_on_sqlite_leave_one_winner(mlops_home, tiny_model, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from registry.release import promote
    from registry.testing import signed_in
    from registry.transition import RefusedError

    versions = _setup(tiny_model, tmp_path, 3)

    def attempt(version: str) -> dict:
        try:
            promote(signed_in("bob"), "bot", version, "staging", expect_version="none")
            return {"version": version, "won": True}
        except RefusedError as err:
            return {"version": version, "won": False, "why": str(err)}

    with ThreadPoolExecutor(len(versions)) as pool:
        _check_one_winner(list(pool.map(attempt, versions)))
