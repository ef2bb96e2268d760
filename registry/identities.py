"""Identities in the governed store: the registry's ledger, verified before it is believed.

An identity (name, role, argon2id password hash) is whatever the newest verified `user_add` / `user_update`
entry of the governance stream says. Adding a user or changing a role is a ledgered admin act; a user may change
their own password. The first admin is created once, by `mlops registry bootstrap`, which also creates the
registry's key and records the release policy in force. Nothing in the caller's environment names another source:
there is no identities file to point at.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlops.identities import AuthError, Identity, check_name, check_password, check_role, require
from registry.transition import RefusedError

GOVERNANCE = "(registry)"  # the ledger's governance stream: identities and the release policy, no model
USER_ACTIONS = ("bootstrap", "user_add", "user_update", "user_remove")


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str


def users_in(entries) -> dict[str, User]:
    """Every identity the governance entries define, as of the newest one."""
    found: dict[str, User] = {}
    for e in entries:
        if e.model == GOVERNANCE and e.action == "user_remove":
            found.pop(e.evidence["name"], None)
        elif e.model == GOVERNANCE and e.action in USER_ACTIONS:
            ev = e.evidence
            found[ev["name"]] = User(ev["name"], ev["role"], ev["password_hash"])
    return found


def _hasher():
    from argon2 import PasswordHasher

    return PasswordHasher()


def list_users(url: str | None = None) -> list[Identity]:
    from registry.ledger import verified

    return [Identity(u.name, u.role) for _, u in sorted(users_in(verified(url).entries).items())]


def user_of(name: str, url: str | None = None) -> User | None:
    from registry.ledger import verified

    return users_in(verified(url).entries).get(name)


def authenticate(name: str | None, password: str | None, url: str | None = None) -> Identity:
    """The identity for a name and password; AuthError (same message for unknown user and wrong password)."""
    from argon2.exceptions import InvalidHashError, VerificationError

    from mlops.identities import PASSWORD_ENV, USER_ENV

    if not name:
        raise AuthError(f"no identity given. Fix: set {USER_ENV} and {PASSWORD_ENV} (users are listed by "
                        "`mlops registry user list`).")
    user = user_of(name, url)
    refused = AuthError(f"authentication failed for '{name}': unknown user or wrong password. Fix: check "
                        f"{USER_ENV} and {PASSWORD_ENV}, or ask an admin to reset it with `mlops registry user "
                        f"passwd {name}`.")
    if user is None or not password:
        raise refused
    try:
        _hasher().verify(user.password_hash, password)
    except (VerificationError, InvalidHashError):
        raise refused from None
    return Identity(name, user.role)


# --------------------------------------------------------------------------- ledgered acts


def bootstrap(admin: str, password: str, *, policy: dict, url: str | None = None) -> list:
    """Create the registry in an empty store: tables, key, the first admin and the release policy in force."""
    from registry.ledger import create_registry, ledger_url
    from registry.transition import run

    check_name(admin)
    check_password(password)
    db = ledger_url(url)
    create_registry(db)
    from registry.spotcheck_store import create_tables

    create_tables(db)
    digest = _hasher().hash(password)

    def plan_for(state):
        from registry.transition import Plan

        return Plan(entries=[
            dict(actor=admin, action="bootstrap", model=GOVERNANCE, reason="the registry's first admin",
                 evidence={"name": admin, "role": "admin", "password_hash": digest}),
            dict(actor=admin, action="policy", model=GOVERNANCE, reason="the release policy at bootstrap",
                 evidence={"policy": policy}),
        ])

    return run(GOVERNANCE, plan_for, url=db)


def add_user(actor: Identity, name: str, role: str, password: str, *, url: str | None = None):
    from registry.transition import Plan, run

    require(actor, "manage_users")
    check_name(name)
    check_role(role)
    check_password(password)
    digest = _hasher().hash(password)

    def plan_for(state):
        _still_admin(state, actor)
        if name in state.users:
            raise RefusedError(f"user '{name}' already exists. Fix: use `mlops registry user passwd {name}`.")
        return Plan(entries=[dict(actor=actor.name, action="user_add", model=GOVERNANCE, reason=f"added {name}",
                                  evidence={"name": name, "role": role, "password_hash": digest})])

    return run(GOVERNANCE, plan_for, url=url)[0]


def set_password(actor: Identity, name: str, password: str, *, role: str | None = None, url: str | None = None):
    """Change a password (one's own, or anyone's as an admin) and, as an admin, a role; ledgered."""
    from mlops.errors import NotFoundError, did_you_mean
    from registry.transition import Plan, run

    if actor.name != name or role is not None:
        require(actor, "manage_users")
    check_password(password)
    if role is not None:
        check_role(role)
    digest = _hasher().hash(password)
    changed: list[Identity] = []

    def plan_for(state):
        if actor.name != name or role is not None:
            _still_admin(state, actor)
        user = state.users.get(name)
        if user is None:
            raise NotFoundError(f"user '{name}' does not exist: {did_you_mean(name, state.users)}. "
                                f"Fix: add it with `mlops registry user add {name} --role ...`.")
        new_role = role or user.role
        what = "password changed" + (f", role {user.role} -> {new_role}" if new_role != user.role else "")
        changed[:] = [Identity(name, new_role)]
        return Plan(entries=[dict(actor=actor.name, action="user_update", model=GOVERNANCE,
                                  reason=f"{name}: {what}",
                                  evidence={"name": name, "role": new_role, "password_hash": digest})])

    run(GOVERNANCE, plan_for, url=url)
    return changed[0]


def remove_user(actor: Identity, name: str, *, url: str | None = None):
    """Revoke an identity (admin); ledgered. Sessions and API sign-ins of that name end at their next check."""
    from mlops.errors import NotFoundError, did_you_mean
    from registry.transition import Plan, run

    require(actor, "manage_users")

    def plan_for(state):
        _still_admin(state, actor)
        if name not in state.users:
            raise NotFoundError(f"user '{name}' does not exist: {did_you_mean(name, state.users)}.")
        if name == actor.name:
            raise RefusedError("an admin may not remove themselves. Fix: ask another admin.")
        return Plan(entries=[dict(actor=actor.name, action="user_remove", model=GOVERNANCE, reason=f"removed {name}",
                                  evidence={"name": name})])

    return run(GOVERNANCE, plan_for, url=url)[0]


def _still_admin(state, actor: Identity) -> None:
    """The role is re-read from the ledger under the write lock: a demoted admin's session acts no more."""
    user = state.users.get(actor.name)
    if user is None or user.role != "admin":
        raise AuthError(f"'{actor.name}' is no admin in the registry now. Fix: act as an admin.")
