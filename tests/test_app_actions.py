"""Every action of the approval app, and every refusal, asserted on the registry and the ledger afterwards."""

from __future__ import annotations

import re

import pytest

from app.testing import app_test, log_in, open_page, request_key
from registry.testing import PASSWORDS


def who(name: str):
    from registry.testing import signed_in

    return signed_in(name)


def texts(at, kind: str) -> list[str]:
    """The elements' text as read on the page: Markdown escapes (`ui.md`) are undone."""
    return [re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", str(e.value)) for e in getattr(at, kind)]


def page(name: str, page_name: str, **params):
    at = log_in(app_test(), name, PASSWORDS[name])
    return open_page(at, page_name, **params)


def ledger() -> list:
    from registry import ledger as store

    return store.entries()  # every entry: sequence numbers count the governance entries too


def state():
    from registry.audit import model_state

    return model_state("bot")


def aliases() -> dict:
    from registry.transition import registry_aliases

    return registry_aliases("bot")


def decide(at, version: str, verb: str, comment: str):
    key = request_key("bot", version)
    at.text_input(key=f"comment-{key}").input(comment)
    return at.button(key=f"{verb}-{key}").click().run()


def approve_v2_outside_the_app():
    from registry.release import decide as act

    act(who("bob"), "bot", "2", "second pair of eyes", approve=True)


def test_an_approver_approves_a_request_and_the_ledger_records_her_and_her_comment(app_store):
    at = page("alice", "approvals")
    before = len(ledger())
    at = decide(at, "2", "approve", "refund answers checked against the policy")
    assert not at.exception
    assert any("Approve v2 of bot: done as alice. Ledger entry #17" in s for s in texts(at, "success"))
    entry = ledger()[-1]
    assert (entry.seq, entry.action, entry.actor, entry.version, entry.reason) == \
        (before + 1, "approve", "alice", "2", "refund answers checked against the policy")
    assert [g["gate"] for g in entry.evidence["gates"]] == ["lineage", "data", "eval", "contamination"]
    assert state().approved_request("2", "production").decided_by == "alice"
    assert not [b for b in at.button if b.key and b.key.startswith("approve-bot-2-")]  # gone from the queue


def test_a_decision_without_a_comment_is_refused_by_the_registry_and_nothing_is_written(app_store):
    at = page("alice", "approvals")
    before = ledger()
    at = decide(at, "2", "approve", "   ")
    assert not at.exception
    assert any("needs a comment saying why" in e for e in texts(at, "error"))
    assert ledger() == before and state().pending()[0].version == "2"


def test_self_approval_is_disabled_with_the_four_eyes_reason_and_refused_by_the_module(app_store):
    from registry.release import decide as act
    from registry.transition import RefusedError

    at = page("alice", "approvals")
    button = at.button(key=f"approve-{request_key('bot', '3')}")
    assert button.disabled
    reason = "four-eyes rule: 'alice' requested version 3 of 'bot' and so may not approve it"
    assert any(reason in c for c in texts(at, "caption"))
    before = ledger()
    with pytest.raises(RefusedError, match=reason):
        act(who("alice"), "bot", "3", "looks fine to me", approve=True)
    assert ledger() == before
    assert not page("bob", "approvals").button(key=f"approve-{request_key('bot', '3')}").disabled


def test_a_failing_gate_disables_approval_until_an_admin_override_is_ledgered(app_store):
    at = page("bob", "approvals")
    key = request_key("bot", "4")
    assert at.button(key=f"approve-{key}").disabled
    assert any("eval gate failed" in c and "contamination gate failed" in c for c in texts(at, "caption"))
    admin = page("admin", "version", model="bot", version="4")
    admin.selectbox(key="override_gate").set_value("all").run()
    admin.text_input(key="override_reason").input("known regression accepted by the product owner")
    admin = admin.button(key="override_button").click().run()
    assert not admin.exception
    entry = ledger()[-1]
    assert (entry.action, entry.actor, entry.evidence, entry.version) == ("override", "admin", {"gate": "all"}, "4")
    assert any("Gate override (all) by admin" in w for w in texts(admin, "warning"))  # shown for good
    at = open_page(at, "approvals")
    assert not at.button(key=f"approve-{key}").disabled


def test_an_approver_may_not_override_a_gate(app_store):
    at = page("bob", "version", model="bot", version="4")
    assert at.button(key="override_button").disabled
    assert any("'bob' has role 'approver', which may not override" in c for c in texts(at, "caption"))


def test_a_rejection_closes_the_request_with_the_reason(app_store):
    at = decide(page("bob", "approvals"), "4", "reject", "billing regressed badly")
    assert not at.exception
    entry = ledger()[-1]
    assert (entry.action, entry.actor, entry.reason) == ("reject", "bob", "billing regressed badly")
    assert [r.version for r in state().pending()] == ["2", "3"]
    assert next(r for r in state().requests if r.version == "4").status == "rejected"


def test_a_trainer_asks_for_a_release_but_may_not_approve(app_store):
    at = page("tina", "approvals")
    assert all(b.disabled for b in at.button if b.key and b.key.startswith("approve-"))
    assert any("'tina' has role 'trainer', which may not approve" in c for c in texts(at, "caption"))
    at.selectbox(key="request_version").set_value("2").run()
    at.radio(key="request_to").set_value("staging").run()
    at.text_input(key="request_comment").input("try it on staging first")
    at = at.button(key="request_button").click().run()
    assert not at.exception
    entry = ledger()[-1]
    assert (entry.action, entry.actor, entry.version, entry.to_stage, entry.reason) == \
        ("request", "tina", "2", "staging", "try it on staging first")


def test_promote_previews_the_change_and_moves_production_through_the_registry(app_store):
    approve_v2_outside_the_app()
    at = page("alice", "release", model="bot", version="2")
    shown = "\n".join(texts(at, "markdown"))
    assert "**@production**: v1 → **v2**" in shown and "v1: production → **archived**" in shown
    assert "moves from v1" in shown and "to **v2**" in shown
    assert at.button(key="promote_button").disabled  # until the preview is confirmed
    at = at.checkbox(key="promote_confirm").check().run()
    at = at.button(key="promote_button").click().run()
    assert not at.exception
    assert aliases() == {"production": "2"}
    entry = ledger()[-1]
    assert (entry.action, entry.actor, entry.alias_before, entry.alias_after) == ("promote", "alice", "1", "2")
    assert state().stage_of("1") == "archived" and state().stage_of("2") == "production"
    assert any("MLflow now: **@production → v2** (agrees with the ledger)" in m for m in texts(at, "markdown"))
    assert not at.checkbox(key="promote_confirm").value  # the next decision starts unconfirmed


def test_a_promotion_after_someone_else_moved_production_is_refused_and_changes_nothing(app_store):
    from registry.release import decide as act
    from registry.release import promote

    approve_v2_outside_the_app()
    act(who("bob"), "bot", "3", "fine", approve=True)
    at = page("alice", "release", model="bot", version="2")  # loads @production = v1
    at = at.checkbox(key="promote_confirm").check().run()
    promote(who("bob"), "bot", "3", "production", expect_version="1")  # meanwhile, in another browser
    before = ledger()
    at = at.button(key="promote_button").click().run()
    assert not at.exception
    assert any("production of 'bot' moved from 1 to 3 since you loaded it" in e for e in texts(at, "error"))
    assert aliases() == {"production": "3"} and ledger() == before


def test_rollback_previews_and_moves_production_back_marking_the_version_rolled_back(app_store):
    from registry.release import promote

    approve_v2_outside_the_app()
    promote(who("bob"), "bot", "2", "production", expect_version="1")
    at = page("alice", "release", model="bot")
    at = at.button_group(key="release_action").set_value("Rollback").run()
    assert at.selectbox(key="rollback_to").value == "1"  # the previous champion, from the ledger
    assert any("**@production**: v2 → **v1**" in m and "v2: production → **rolled_back**" in m
               for m in texts(at, "markdown"))
    at = at.checkbox(key="rollback_confirm").check().run()
    at = at.button(key="rollback_button").click().run()
    assert any("a rollback needs a comment" in e for e in texts(at, "error")) and aliases() == {"production": "2"}
    at.text_input(key="rollback_reason").input("v2 answers refunds in the wrong currency")
    at = at.checkbox(key="rollback_confirm").check().run()
    at = at.button(key="rollback_button").click().run()
    assert not at.exception
    assert aliases() == {"production": "1"}
    entry = ledger()[-1]
    assert (entry.action, entry.actor, entry.alias_before, entry.alias_after, entry.reason) == \
        ("rollback", "alice", "2", "1", "v2 answers refunds in the wrong currency")
    assert entry.evidence["artifacts"]["content_id"] == state().versions["1"].content_id  # files were checked
    assert state().stage_of("2") == "rolled_back"


def test_rollback_with_no_earlier_champion_is_shown_as_not_possible(app_store):
    at = page("alice", "release", model="bot")
    at = at.button_group(key="release_action").set_value("Rollback").run()
    assert not [b for b in at.button if b.key == "rollback_button"]  # no target is offered
    assert any("no earlier production version to roll back to" in e for e in texts(at, "error"))


def test_a_ledger_database_outage_during_an_action_is_reported_and_changes_nothing(app_store, monkeypatch):
    at = page("alice", "approvals")
    key = request_key("bot", "2")
    before = ledger()
    at.text_input(key=f"comment-{key}").input("approve during the outage")
    monkeypatch.setenv("MLOPS_REGISTRY_DB", f"sqlite:///{app_store}/gone/nowhere/ledger.db")
    at = at.button(key=f"approve-{key}").click().run()
    assert not at.exception
    assert any("could not be done: the registry store" in e and "does not exist" in e for e in texts(at, "error"))
    monkeypatch.delenv("MLOPS_REGISTRY_DB")
    assert ledger() == before and [r.version for r in state().pending()] == ["2", "3", "4"]
    at = open_page(at, "approvals")
    assert not at.exception and not at.button(key=f"approve-{key}").disabled  # usable again


def test_a_rollback_in_a_fresh_process_reads_the_configured_store_not_the_working_directory(app_store, tmp_path):
    """The app server is such a process: a version's `models:/m-...` source must resolve in the project's store."""
    import os
    import subprocess
    import sys

    from registry.release import promote

    approve_v2_outside_the_app()
    promote(who("bob"), "bot", "2", "production", expect_version="1")
    code = ("from registry.testing import signed_in\nfrom registry.release import rollback\n"
            "print(rollback(signed_in('alice'), 'bot', 'checked in a fresh process').version)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**env, "MLOPS_HOME": str(app_store)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1" and aliases() == {"production": "1"}
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
@pytest.mark.postgres
def test_the_app_releases_on_a_postgresql_store_as_on_the_embedded_one(postgres_url, mlops_home, tiny_model,
                                                                        tmp_path, monkeypatch):
    from pathlib import Path

    from app.testing import seed_release
    from registry.audit import verify

    monkeypatch.setenv("MLFLOW_TRACKING_URI", postgres_url)
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root on a database store is ./mlruns
    seed_release(Path(tiny_model["path"]), tmp_path)
    at = decide(page("alice", "approvals"), "2", "approve", "checked on PostgreSQL")
    assert not at.exception and ledger()[-1].action == "approve"
    at = open_page(at, "release", model="bot", version="2")
    at = at.checkbox(key="promote_confirm").check().run()
    at = at.button(key="promote_button").click().run()
    assert not at.exception
    assert aliases() == {"production": "2"} and ledger()[-1].alias_after == "2" and verify("bot").ok
