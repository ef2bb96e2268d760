"""registry.permissions: the app's "may I press this" answers are the release module's own refusals, unchanged."""

from __future__ import annotations

import pytest

from mlops.identities import Identity
from registry.entries import Entry
from registry.gates import GateResult
from registry.state import replay
from registry.transition import RefusedError

ALICE, BOB, TINA, VIC, ADMIN = (Identity("alice", "approver"), Identity("bob", "approver"),
                                Identity("tina", "trainer"), Identity("vic", "viewer"), Identity("admin", "admin"))
PASSING = [GateResult(g, True, "ok") for g in ("lineage", "data", "eval", "contamination")]
FAILING = [*PASSING[:2], GateResult("eval", False, "the gate report failed: billing regressed"), PASSING[3]]


def entry(seq, actor, action, version, **kw) -> Entry:
    return Entry(seq=seq, ts=f"2026-01-01T00:00:{seq:02d}.000000Z", actor=actor, action=action, model="bot",
                 version=version, **kw)


def state_with(*extra):
    """v1 in production; v2 a candidate trained by tina, requested by alice."""
    base = [
        entry(1, "tina", "register", "1", to_stage="candidate", evidence={"trainer": "tina"}),
        entry(2, "tina", "register", "2", to_stage="candidate", evidence={"trainer": "tina"}),
        entry(3, "tina", "request", "1", from_stage="candidate", to_stage="production"),
        entry(4, "bob", "approve", "1", to_stage="production", evidence={"request_seq": 3}),
        entry(5, "bob", "promote", "1", from_stage="candidate", to_stage="production", alias="production",
              alias_after="1", evidence={"request_seq": 3}),
        entry(6, "alice", "request", "2", from_stage="candidate", to_stage="production"),
    ]
    return replay("bot", [*base, *extra])


def refusal(fn, *args, **kwargs) -> str:
    with pytest.raises(Exception) as caught:
        fn(*args, **kwargs)
    return str(caught.value)


def test_self_approval_is_answered_with_the_four_eyes_refusal_of_the_module():
    from registry.permissions import may_decide
    from registry.release import plan_decide

    state = state_with()
    answer = may_decide(ALICE, state, "2", approve=True, gates=PASSING)
    assert not answer.ok and "four-eyes rule: 'alice' requested version 2" in answer.reason
    assert answer.reason == refusal(plan_decide, ALICE, state, "bot", "2", "x", approve=True, gates=PASSING)
    assert may_decide(BOB, state, "2", approve=True, gates=PASSING).ok


def test_a_failing_gate_is_the_reason_approval_and_promotion_are_refused():
    from registry.permissions import may_decide

    answer = may_decide(BOB, state_with(), "2", approve=True, gates=FAILING)
    assert not answer.ok and "eval gate failed: the gate report failed: billing regressed" in answer.reason


def test_roles_are_checked_first_and_named():
    from registry.permissions import may_decide, may_promote, may_request, may_rollback

    state = state_with()
    assert "role 'viewer', which may not approve" in may_decide(VIC, state, "2", approve=False).reason
    assert "role 'trainer', which may not promote" in may_promote(TINA, state, "2", "staging").reason
    assert "role 'viewer', which may not rollback" in may_rollback(VIC, state).reason
    assert may_request(TINA, state, "2", "staging").ok


def test_a_promotion_checked_against_what_the_page_loaded_reports_a_concurrent_change():
    from registry.permissions import may_promote

    moved = state_with(entry(7, "bob", "approve", "2", to_stage="production", evidence={"request_seq": 6}))
    answer = may_promote(BOB, moved, "2", "production", expect_version="none", gates=PASSING)
    assert not answer.ok and "production of 'bot' moved from nothing to 1 since you loaded it" in answer.reason
    allowed = may_promote(BOB, moved, "2", "production", expect_version="1", gates=PASSING)
    assert allowed.ok and allowed.plan.aliases == {"production": ("1", "2")}
    assert allowed.plan.version_tags["1"]["registry.stage"] == "archived"


def test_a_rollback_preview_names_the_target_without_reading_its_files(monkeypatch):
    import registry.integrity
    from registry.permissions import may_rollback

    def no_reads(*args, **kwargs):
        raise AssertionError("a preview must not materialize the target")

    monkeypatch.setattr(registry.integrity, "check_artifacts", no_reads)
    two = state_with(entry(7, "bob", "approve", "2", to_stage="production", evidence={"request_seq": 6}),
                     entry(8, "bob", "promote", "2", from_stage="candidate", to_stage="production",
                           alias="production", alias_before="1", alias_after="2",
                           evidence={"displaced": "1", "displaced_to": "archived", "request_seq": 6}))
    answer = may_rollback(BOB, two, expect_version="2")
    assert answer.ok and answer.plan.aliases == {"production": ("2", "1")}
    assert answer.plan.version_tags["2"]["registry.stage"] == "rolled_back"
    assert "no earlier production version" in may_rollback(BOB, state_with()).reason


def test_an_unknown_gate_cannot_be_overridden_and_only_an_admin_may_override():
    from registry.permissions import may_override

    state = state_with()
    assert may_override(ADMIN, state, "2", "eval").ok
    assert "gate 'speed' does not exist" in may_override(ADMIN, state, "2", "speed").reason
    assert "may not override" in may_override(BOB, state, "2", "eval").reason


def test_the_preview_plan_is_what_the_action_would_write():
    from registry.permissions import may_request
    from registry.release import plan_request

    state = state_with()
    assert may_request(TINA, state, "2", "staging").plan.entries == \
        plan_request(TINA, state, "bot", "2", "staging", None).entries
    with pytest.raises(RefusedError, match="already has an open request to production"):
        plan_request(TINA, state, "bot", "2", "production", "again")
