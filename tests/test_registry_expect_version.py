"""A stale --expect-version is refused whatever the target; a promote or rollback already in force says so, exits 4
and writes nothing (never an old entry shown as new); promotions of one version at once write exactly one entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlops.errors import AlreadyInForce
from registry.testing import as_user, run_cli
from registry.transition import ConcurrentChangeError


def ledger_size() -> int:
    from registry import ledger

    return len(ledger.entries())


def content(version: str) -> str:
    from registry.audit import model_state

    return model_state("bot").versions[version].content_id


@pytest.fixture
def in_production(store, tiny_model, tmp_path) -> dict:
    """On each store: v1 released, then v2 released over it (v1 archived: a rollback target). The identities."""
    from registry.testing import release_version, two_versions

    who, _, _ = two_versions(Path(tiny_model["path"]), tmp=tmp_path)
    release_version(who, "bot", "1")
    release_version(who, "bot", "2", champion=("1", content("1")))
    return who


@pytest.fixture
def approved(mlops_home, tiny_model, tmp_path) -> dict:
    """v1 in production, v2 approved for production and not yet promoted. The identities."""
    from registry.release import decide
    from registry.testing import challenger_requested

    who = challenger_requested(Path(tiny_model["path"]), tmp=tmp_path, comment="ready")
    decide(who["alice"], "bot", "2", "looks good", approve=True)
    return who


def promote_cli(*extra: str) -> tuple[int, str, str]:
    return run_cli("registry", "promote", "bot", "2", "--to", "production", *extra, env=as_user("bob"))


def test_a_stale_expect_version_is_refused_even_for_the_version_already_in_production(in_production):
    from registry.release import promote

    before = ledger_size()
    with pytest.raises(ConcurrentChangeError, match="production of 'bot' moved from 99 to 2 since you loaded it"):
        promote(in_production["bob"], "bot", "2", "production", expect_version="99")
    code, out, err = promote_cli("--expect-version", "99")
    assert code == 2 and "moved from 99 to 2 since you loaded it" in err and not out, (out, err)
    assert ledger_size() == before


def test_promoting_the_version_in_production_again_says_it_is_in_force_exits_4_and_writes_nothing(in_production):
    from registry.release import promote

    before = ledger_size()
    with pytest.raises(AlreadyInForce, match="version 2 of 'bot' already holds @production; nothing was written"):
        promote(in_production["bob"], "bot", "2", "production", expect_version="2")
    code, out, err = promote_cli()
    assert code == 4 and not err, err
    assert out.splitlines() == ["already in force: version 2 of 'bot' already holds @production; nothing was "
                                "written."]  # one line, and no ledger entry (#seq ...) shown as if just written
    code, out, _ = promote_cli("--json")
    assert code == 4 and json.loads(out) | {"message": ""} == {"in_force": True, "model": "bot", "version": "2",
                                                               "alias": "production", "message": ""}
    assert ledger_size() == before


def test_rolling_back_to_the_version_in_production_says_it_is_in_force_exits_4_and_writes_nothing(in_production):
    from registry.release import rollback

    before = ledger_size()
    with pytest.raises(ConcurrentChangeError, match="moved from 99 to 2"):
        rollback(in_production["bob"], "bot", "regressed", to_version="2", expect_version="99")
    with pytest.raises(AlreadyInForce, match="version 2 of 'bot' already holds @production"):
        rollback(in_production["bob"], "bot", "regressed", to_version="2", expect_version="2")
    code, out, err = run_cli("registry", "rollback", "bot", "--to", "2", "--reason", "regressed",
                             env=as_user("bob"))
    assert code == 4 and out.startswith("already in force: version 2") and len(out.splitlines()) == 1, (out, err)
    code, out, _ = run_cli("registry", "rollback", "bot", "--to", "2", "--reason", "regressed", "--json",
                           env=as_user("bob"))
    assert code == 4 and json.loads(out)["in_force"] is True and json.loads(out)["version"] == "2"
    assert ledger_size() == before


def _promotions_of_v2() -> list:
    from registry import ledger

    return [e for e in ledger.entries("bot") if e.action == "promote" and e.version == "2"]


def test_threads_promoting_one_version_at_once_write_exactly_one_entry(approved):
    from concurrent.futures import ThreadPoolExecutor

    from registry.release import promote
    from registry.testing import signed_in

    def attempt(_: int) -> str:
        try:
            promote(signed_in("bob"), "bot", "2", "production")
            return "won"
        except AlreadyInForce:
            return "in force"

    with ThreadPoolExecutor(4) as pool:
        outcomes = sorted(pool.map(attempt, range(4)))
    assert outcomes == ["in force"] * 3 + ["won"]
    assert len(_promotions_of_v2()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("expected,loser", [("-", "already holds @production"),
                                            ("1", "moved from 1 to 2 since you loaded it")])
def test_processes_promoting_one_version_at_once_write_exactly_one_entry(approved, expected, loser):
    from registry.testing import race

    outcomes = race("bot", ["2"] * 4, "production", expected=expected)
    losers = [o for o in outcomes if not o["won"]]
    assert len(losers) == 3 and all(loser in o["why"] for o in losers), outcomes
    assert all(o.get("in_force", False) == (expected == "-") for o in losers), outcomes
    assert len(_promotions_of_v2()) == 1
