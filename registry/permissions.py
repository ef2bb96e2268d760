"""Layer 5 (readers): may this identity do that, now, and if not, why not: the release module's own checks, asked without acting.

A user interface (the approval app) disables a button the rules forbid and shows the reason. It must not keep a
second copy of the rules, so each question here runs the role check and the action's pure `plan_*` function from
`registry.release` on a state the caller already read, and turns a refusal into its message. The action itself
re-checks everything on fresh state when it runs, so a stale answer here can only ever be refused, never slip
through.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlops.errors import MLOpsError
from mlops.identities import Identity, require
from registry.state import ModelState
from registry.transition import Plan


@dataclass(frozen=True)
class Permission:
    """`ok`, or the refusal's message in `reason`; `plan` is what the action would write when it is allowed."""

    ok: bool
    reason: str = ""
    plan: Plan | None = None

    def __bool__(self) -> bool:
        return self.ok


def _ask(actor: Identity, action: str, plan_fn, *args, **kwargs) -> Permission:
    try:
        require(actor, action)
        return Permission(True, plan=plan_fn(*args, **kwargs))
    except MLOpsError as err:
        return Permission(False, str(err))


def may_request(actor: Identity, state: ModelState, version: str, to_stage: str) -> Permission:
    from registry.release import plan_request

    return _ask(actor, "request", plan_request, actor, state, state.model, version, to_stage, None)


def may_decide(actor: Identity, state: ModelState, version: str, *, approve: bool,
               gates: list | None = None) -> Permission:
    """Approve (four-eyes rule, gates) or reject the pending request. `gates`: GateResults already read."""
    from registry.release import plan_decide

    return _ask(actor, "approve", plan_decide, actor, state, state.model, version, None, approve=approve,
                gates=gates)


def may_promote(actor: Identity, state: ModelState, version: str, to_stage: str, *,
                expect_version: str | None = None, gates: list | None = None) -> Permission:
    from registry.release import plan_promote

    return _ask(actor, "promote", plan_promote, actor, state, state.model, version, to_stage,
                expect_version=expect_version, gates=gates)


def may_rollback(actor: Identity, state: ModelState, *, to_version: str | None = None,
                 expect_version: str | None = None) -> Permission:
    """Without reading the target's files: the rollback itself checks them and refuses altered artifacts."""
    from registry.release import plan_rollback

    return _ask(actor, "rollback", plan_rollback, actor, state, state.model, None, to_version=to_version,
                expect_version=expect_version, check_artifacts=False)


def may_override(actor: Identity, state: ModelState, version: str, gate: str) -> Permission:
    from registry.release import plan_override

    return _ask(actor, "override", plan_override, actor, state, state.model, version, gate, None)


def may_review_spot_check(actor: Identity, state: ModelState, check: dict) -> Permission:
    """Record verdicts on this spot-check (the role, and never on a version one trained or registered)."""
    from registry.spotcheck import may_review

    try:
        may_review(actor, state, check)
        return Permission(True)
    except MLOpsError as err:
        return Permission(False, str(err))
