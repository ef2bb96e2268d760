"""The approval app in Streamlit's AppTest: login, session expiry, every page on a seeded release, outages."""

from __future__ import annotations

import json
import re
import time

import pytest

from app.testing import app_test, log_in, open_page
from registry.testing import PASSWORDS


def texts(at, kind: str) -> list[str]:
    """The elements' text as read on the page: Markdown escapes (`ui.md`) are undone."""
    return [re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", str(e.value)) for e in getattr(at, kind)]


def everything(at) -> str:
    return "\n".join(texts(at, "markdown") + texts(at, "caption") + texts(at, "success") + texts(at, "error")
                     + texts(at, "warning") + texts(at, "info") + texts(at, "title"))


def clean(at) -> None:
    """No uncaught exception reached the page, and no error message either."""
    assert not at.exception, [e.value for e in at.exception]
    assert texts(at, "error") == []


def logged_in(name: str):
    at = log_in(app_test(), name, PASSWORDS[name])
    assert not at.exception and at.title[0].value == "Models", everything(at)
    return at


def test_login_with_the_registry_password_opens_the_app_as_that_identity(app_store):
    at = logged_in("alice")
    assert "**alice** · approver" in texts(at, "markdown")
    assert at.session_state["mlops_identity"]["name"] == "alice"
    clean(at)


@pytest.mark.parametrize("name,password", [("alice", "not-her-password"), ("mallory", "anything-at-all"),
                                           ("alice", "")])
def test_a_wrong_password_or_unknown_user_is_refused_with_one_message(app_store, name, password):
    at = log_in(app_test(), name, password)
    assert texts(at, "error") == ["Login failed: unknown user or wrong password."]
    assert at.title[0].value == "Release approvals" and "mlops_identity" not in at.session_state
    assert "identities.yaml" not in everything(at)  # no server path for someone not logged in


def test_an_idle_session_expires_and_asks_to_log_in_again(app_store, monkeypatch):
    monkeypatch.setenv("MLOPS_APP_SETTINGS", json.dumps({"session_timeout_min": 0.005}))  # 0.3 s
    at = logged_in("bob")
    time.sleep(0.5)
    at.run()
    assert at.title[0].value == "Release approvals"
    assert any("session expired" in t for t in texts(at, "info"))


def test_a_user_removed_from_the_registry_is_logged_out_at_the_next_click(app_store):
    from registry.identities import remove_user
    from registry.testing import signed_in

    at = logged_in("bob")
    remove_user(signed_in("admin"), "bob")
    at.run()
    assert at.title[0].value == "Release approvals"
    assert any("no longer in the registry" in t for t in texts(at, "info"))


def test_models_page_lists_production_staging_and_pending_approvals(app_store):
    at = logged_in("vic")
    clean(at)
    table = at.dataframe[0].value
    row = table[table["model"] == "bot"].iloc[0]
    assert (row["production"], row["staging"], row["versions"]) == ("v1", "—", 4)
    assert row["pending approvals"] == "v2→production, v3→production, v4→production"
    assert "request v4" in row["latest event"]


def test_version_page_shows_lineage_gates_with_reasons_and_contamination(app_store):
    at = open_page(logged_in("vic"), "version", model="bot", version="4")
    assert not at.exception
    shown = everything(at)
    assert "bot v4" in [h.value for h in at.header]
    for expected in ("cfg4", "tiny (bm-test)", "img:1 (immutable)", "c0ffee (clean tree)", "snap-test",
                     "step-00000010", "**eval**: FAILED", "billing regressed", "**contamination**: FAILED",
                     "**lineage**: passed", "2 batches gated by GE, 1 quarantined"):
        assert expected in shown, expected
    batches = at.dataframe[0].value
    assert list(batches["status"]) == ["passed", "quarantined"]
    contamination = [d.value for d in at.dataframe if "id" in d.value.columns][0]
    assert list(contamination["id"]) == ["rr-mc-03"]
    assert at.button(key="override_button").disabled  # a viewer


def test_version_page_names_the_sweep_trial_a_version_came_from(app_store):
    at = open_page(logged_in("vic"), "version", model="bot", version="3")
    assert not at.exception
    trial = [d.value for d in at.dataframe if "study" in d.value.columns][0]
    assert (trial.iloc[0]["study"], trial.iloc[0]["trial"]) == ("tiny", "2")


def test_compare_page_charts_scores_shows_gate_deltas_and_changed_samples(app_store):
    at = open_page(logged_in("vic"), "compare", model="bot", version="2")
    clean(at)
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    titles = [layer.get("title") for spec in specs for layer in spec.get("layer", [spec])]
    assert {"General tasks", "Business dimensions", "loss", "val loss", "tokens per s"} <= set(titles)
    scores = next(s for s in specs if s["layer"][0].get("title") == "General tasks")
    assert scores["layer"][0]["encoding"]["x2"]["field"] == "hi"  # each score carries its interval
    checks = [d.value for d in at.dataframe if "rule" in d.value.columns][0]
    assert set(checks["result"]) == {"pass"} and "non_inferior" in set(checks["rule"])
    shown = everything(at)
    assert "challenger `models:/bot/2` vs `models:/bot/1`" in shown
    assert "**Newly passed** by v2" in shown and "| champion output | challenger output |" in shown


def test_compare_page_explains_a_failing_gate(app_store):
    at = open_page(logged_in("vic"), "compare", model="bot", version="4")
    assert not at.exception
    assert any("regressed against models:/bot/1" in e for e in texts(at, "error"))
    checks = [d.value for d in at.dataframe if "rule" in d.value.columns][0]
    assert "FAIL" in set(checks["result"])


def test_a_viewer_sees_every_action_disabled_with_the_role_as_reason(app_store):
    at = open_page(logged_in("vic"), "approvals")
    assert not at.exception
    decisions = [b for b in at.button if b.key and b.key.startswith(("approve-", "reject-"))]
    assert len(decisions) == 6 and all(b.disabled for b in decisions)
    assert any("'vic' has role 'viewer', which may not approve" in c for c in texts(at, "caption"))
    assert at.button(key="request_button").disabled
    at = open_page(at, "release", model="bot", version="2")
    assert at.button(key="promote_button").disabled
    assert any("may not promote" in e for e in texts(at, "error"))


def test_ledger_page_verifies_the_chain_and_says_what_was_in_production_at_a_time(app_store):
    at = open_page(logged_in("vic"), "ledger", model="bot")
    clean(at)
    assert any("Chain verified: 16 entries" in s for s in texts(at, "success"))
    assert any("agree with the ledger for bot" in s for s in texts(at, "success"))
    assert any("@production → v1" in m for m in texts(at, "markdown"))
    timeline = [d.value for d in at.dataframe if "alias" in d.value.columns][0]
    assert list(timeline["#"])[:1] == [16] and "@production: - → 1" in set(timeline["alias"])
    at.text_input(key="at_time").input("2000-01-01T00:00:00Z").run()
    assert any("At 2000-01-01 00:00:00 UTC: **@production → nobody**" in m for m in texts(at, "markdown"))
    at.text_input(key="at_time").input("yesterday").run()
    assert any("is not an ISO time" in e for e in texts(at, "error")) and not at.exception


def test_ledger_page_reports_a_tampered_entry(app_store):
    import sqlalchemy as sa

    from registry import ledger

    at = logged_in("vic")
    with ledger.engine().begin() as conn:
        conn.execute(sa.text("UPDATE mlops_ledger SET actor = 'mallory' WHERE seq = 12"))
    at = open_page(at, "ledger", model="bot")
    # Identities live in the ledger: one that does not verify signs everybody out, naming the bad entry.
    assert not at.exception
    assert any("does not verify: entry 12" in t for t in texts(at, "info"))
    assert "logout" not in [b.key for b in at.button]


def test_a_tracking_store_outage_is_shown_in_plain_words_and_the_app_stays_usable(app_store, monkeypatch):
    at = logged_in("alice")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql+psycopg://postgres@127.0.0.1:1/nowhere")
    at = open_page(at, "compare", model="bot")
    assert not at.exception
    assert any("cannot be used" in e and "Fix:" in e for e in texts(at, "error"))
    assert at.button(key="logout")  # the frame still works
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    at = open_page(at, "models")
    clean(at)


def test_a_page_asked_for_before_logging_in_shows_only_the_login_form(app_store):
    at = app_test().run()
    at = open_page(at, "approvals")
    assert at.title[0].value == "Release approvals" and not at.button(key="login_submit").disabled
    assert not [b for b in at.button if b.key and b.key.startswith(("approve-", "reject-"))]
    at.text_input(key="login_user").input("alice")
    at.text_input(key="login_password").input(PASSWORDS["alice"])
    at = at.button(key="login_submit").click().run()
    assert at.title[0].value == "Approvals"  # where the address pointed


def test_a_model_registered_outside_the_registry_is_listed_as_ungoverned(app_store):
    from mlops.tracking import client, use_store

    use_store()  # MLflow resolves a `models:/m-...` source through the process-wide store, as a user's script would set
    c = client()
    source = c.get_model_version("bot", "1").source
    c.create_registered_model("legacy")
    c.create_model_version("legacy", source, run_id=c.get_model_version("bot", "1").run_id)
    at = logged_in("vic")
    table = at.dataframe[0].value
    assert table[table["model"] == "legacy"].iloc[0]["governed"] == "no: not in the ledger"
    assert any("legacy" in w and "no rule or ledger covers them" in w for w in texts(at, "warning"))
    at = open_page(at, "version", model="legacy", version="1")
    assert not at.exception
    assert any("registered in MLflow directly, not through the registry" in w for w in texts(at, "warning"))


def test_an_alias_moved_behind_the_registrys_back_is_flagged_on_every_page_that_shows_it(app_store):
    from mlops.tracking import client
    from registry.transition import flush_display

    flush_display()  # the acts' own copies land first
    client().set_registered_model_alias("bot", "production", "4")  # MLflow UI's pencil icon
    at = logged_in("vic")
    assert any("differ from the ledger" in w for w in texts(at, "warning"))
    at = open_page(at, "release", model="bot")
    assert any("moved them outside the registry" in w for w in texts(at, "warning"))
    at = open_page(at, "ledger", model="bot")
    assert any("@production points to 4 in MLflow but the ledger says 1" in e for e in texts(at, "error"))


def test_text_people_typed_is_shown_as_text_not_rendered_as_markdown(app_store):
    from registry.release import decide
    from registry.testing import signed_in

    decide(signed_in("bob"), "bot", "4", "ok", approve=False)
    from registry.release import request

    request(signed_in("tina"), "bot", "4", "production", "![pixel](http://tracker.example/p.png) "
            "[click](http://evil.example) :red[URGENT]")
    at = open_page(logged_in("vic"), "approvals")
    shown = "\n".join(str(e.value) for e in at.markdown)  # the source, escapes included
    assert "\\!\\[pixel\\]\\(http\\://tracker" in shown and "\\:red\\[URGENT\\]" in shown
    assert "![pixel](" not in shown and "[click](http" not in shown


def test_runs_link_into_the_mlflow_ui_when_one_is_configured(app_store, monkeypatch):
    from mlops.model_refs import describe

    monkeypatch.setenv("MLOPS_APP_SETTINGS", json.dumps({"mlflow_ui_url": "http://mlflow.example:5000/"}))
    at = open_page(logged_in("vic"), "version", model="bot", version="2")
    run = describe("models:/bot/2").run_id
    assert any("(http://mlflow.example:5000/#/experiments/" in m and f"/runs/{run})" in m
               for m in texts(at, "markdown"))
