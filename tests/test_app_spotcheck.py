"""The spot-check page: a reviewer records blind verdicts; the registry's reviewer rules hold in the app too."""

from __future__ import annotations

from app.testing import app_test, log_in, open_page
from registry.testing import PASSWORDS


def fake_answers(ref: str, conversations: list[list[dict]], **_options) -> list[dict]:
    who = "challenger" if ref.endswith("/2") else "champion"
    return [{"text": f"{who} answer {i}", "latency_ms": 1.0, "tokens": 3, "error": None}
            for i, _ in enumerate(conversations)]


def new_check(n: int = 3) -> str:
    from registry.spotcheck import create
    from registry.testing import signed_in

    return create(signed_in("alice"), "bot", "2", n=n, seed=5, answer=fake_answers)["check_id"]


def spot_page(name: str, check_id: str):
    return open_page(log_in(app_test(), name, PASSWORDS[name]), "spotcheck", model="bot", check=check_id)


def test_a_reviewer_records_blind_verdicts_and_the_completed_review_is_ledgered(app_store):
    from registry import ledger
    from registry.spotcheck import blind_items, summary

    check_id = new_check()
    at = spot_page("bob", check_id)
    assert not at.exception
    shown = "\n".join(str(m.value) for m in at.markdown)
    assert "challenger answer" in shown and "champion answer" in shown
    assert all(list(r.options) == ["A", "B", "same"] for r in at.radio)  # blind: never who wrote which
    items = blind_items(check_id)
    prefix = f"spot-{check_id}"
    for item in items:  # bob recognises the challenger's answer and prefers it
        letter = "A" if item["answer_a"].startswith("challenger") else "B"
        at.radio(key=f"{prefix}-pref-{item['item']}").set_value(letter)
    at = next(iter(at.get("form_submit_button"))).click().run()
    assert not at.exception
    done = summary(check_id)
    assert done["complete"] and done["tallies"]["better"] == len(items) and done["tallies"]["reviewers"] == ["bob"]
    assert ledger.entries("bot")[-1].action == "spot_check_review"
    assert any("recorded as bob" in str(s.value) for s in at.success)


def test_a_trainer_cannot_record_verdicts_and_the_page_says_why(app_store):
    from registry.spotcheck import summary

    check_id = new_check(n=2)
    at = spot_page("tina", check_id)  # tina trained and registered v2, and her role has no spot_check
    assert not at.exception
    assert any("'tina'" in str(c.value) and "may not spot check" in str(c.value) for c in at.caption)
    submit = next(iter(at.get("form_submit_button")))
    assert submit.disabled
    assert summary(check_id)["reviewed"] == 0
