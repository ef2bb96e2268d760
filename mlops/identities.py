"""Who may do what: the role table, and the acting identity.

Identities themselves (name, role, Ed25519 public key) live in the governed store, the registry's verified
ledger (`registry.identities`), and change only by signed admin acts; nothing in the caller's environment can
name another source. The core asks the registry through the `authenticate` service, never importing it. Acting
commands read the name from `MLOPS_USER` and the passphrase that unlocks that person's own key file from
`MLOPS_PASSWORD`: a name alone never acts, since every act is signed with the key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from mlops.errors import MLOpsError, did_you_mean

USER_ENV = "MLOPS_USER"
PASSWORD_ENV = "MLOPS_PASSWORD"
ROLES = ("viewer", "trainer", "approver", "admin")
NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{1,39}$")

# What each role may do. One table: the CLI, the app and the registry all ask `can(...)`.
PERMISSIONS: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "trainer": frozenset({"read", "train", "register", "request"}),
    "approver": frozenset({"read", "request", "approve", "promote", "rollback", "spot_check"}),
    "admin": frozenset({"read", "train", "register", "request", "approve", "promote", "rollback", "override",
                        "reconcile", "manage_users", "manage_policy", "spot_check"}),
}


class AuthError(MLOpsError):
    """Wrong or missing credentials, or an identity without the role an action needs."""

    exit_code = 3


@dataclass(frozen=True)
class Identity:
    name: str
    role: str
    # The unlocked key that signs this identity's acts (`registry.signing.Signer`); None for a read-only view.
    signer: Any = field(default=None, compare=False, repr=False)

    def can(self, action: str) -> bool:
        return action in PERMISSIONS.get(self.role, frozenset())


def check_name(name: str) -> None:
    if not NAME_RE.match(name or ""):
        raise MLOpsError(f"user name '{name}' is not valid: use 2-40 lowercase letters, digits, '.', '_' or '-', "
                         "starting with a letter. Fix: pick such a name.")


def check_role(role: str) -> None:
    if role not in ROLES:
        raise MLOpsError(f"role '{role}' does not exist: {did_you_mean(role, ROLES)}. Fix: pass one of those.")


def check_password(password: str) -> None:
    if not password or len(password) < 8:
        raise MLOpsError("the password is shorter than 8 characters. Fix: choose a longer one.")


def authenticate(name: str | None, password: str | None) -> Identity:
    """The identity for a name and password, checked by the governed store (the registry's verified ledger)."""
    from mlops.stages import service

    verify = service("authenticate")
    if verify is None:
        raise AuthError("no identity store is installed (the registry stage provides it). Fix: install the "
                        "project with `make install`.")
    return verify(name, password)


def require(identity: Identity, action: str) -> Identity:
    if not identity.can(action):
        allowed = sorted(r for r, p in PERMISSIONS.items() if action in p)
        raise AuthError(f"'{identity.name}' has role '{identity.role}', which may not {action.replace('_', ' ')}. "
                        f"Roles that may: {', '.join(allowed)}. Fix: act as such an identity, or ask an admin to "
                        "change the role.")
    return identity


def from_env(action: str | None = None) -> Identity:
    """The acting identity from MLOPS_USER / MLOPS_PASSWORD, checked for `action` when given."""
    identity = authenticate(os.environ.get(USER_ENV, "").strip(), os.environ.get(PASSWORD_ENV))
    return require(identity, action) if action else identity


def acting_name() -> str | None:
    """Who is acting, for the `mlops.actor` lineage tag: MLOPS_USER, verified when a password is given."""
    name = os.environ.get(USER_ENV, "").strip()
    if not name:
        return None
    if os.environ.get(PASSWORD_ENV):
        authenticate(name, os.environ.get(PASSWORD_ENV))
    return name
