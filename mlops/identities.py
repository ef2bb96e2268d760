"""Who may do what: named identities with a role and an argon2 password hash, kept in one YAML file.

The file (`configs/registry/identities.yaml` by default, `MLOPS_IDENTITIES` to move it) is the one source for
the registry's CLI, the approval app and the server's API keys. Acting commands read the identity from
`MLOPS_USER` and `MLOPS_PASSWORD`. Passwords are hashed with argon2id (argon2-cffi); nothing is hand-rolled.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from mlops.errors import MLOpsError, NotFoundError, did_you_mean

IDENTITIES_ENV = "MLOPS_IDENTITIES"
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
                        "reconcile", "manage_users", "spot_check"}),
}


class AuthError(MLOpsError):
    """Wrong or missing credentials, or an identity without the role an action needs."""

    exit_code = 3


@dataclass(frozen=True)
class Identity:
    name: str
    role: str

    def can(self, action: str) -> bool:
        return action in PERMISSIONS.get(self.role, frozenset())


def identities_path() -> Path:
    from mlops.paths import project_home

    explicit = os.environ.get(IDENTITIES_ENV, "").strip()
    return Path(explicit).expanduser() if explicit else project_home() / "configs" / "registry" / "identities.yaml"


def _hasher():
    from argon2 import PasswordHasher

    return PasswordHasher()


def load_users(path: Path | None = None) -> dict[str, dict]:
    import yaml

    path = path or identities_path()
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    users = data.get("users") or {}
    if not isinstance(users, dict):
        raise MLOpsError(f"identities file {path}: `users` must be a mapping of name -> {{role, password_hash}}. "
                         "Fix: recreate it with `mlops registry user add`.")
    return users


def _save(users: dict[str, dict], path: Path) -> None:
    import yaml

    from mlops.files import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Registry identities: managed by `mlops registry user add|passwd`. Hashes are argon2id.\n"
    atomic_write_text(path, header + yaml.safe_dump({"users": users}, sort_keys=True))


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise MLOpsError(f"role '{role}' does not exist: {did_you_mean(role, ROLES)}. Fix: pass one of those.")


def _check_password(password: str) -> None:
    if not password or len(password) < 8:
        raise MLOpsError("the password is shorter than 8 characters. Fix: choose a longer one.")


def add_user(name: str, role: str, password: str, path: Path | None = None) -> Identity:
    path = path or identities_path()
    if not NAME_RE.match(name or ""):
        raise MLOpsError(f"user name '{name}' is not valid: use 2-40 lowercase letters, digits, '.', '_' or '-', "
                         "starting with a letter. Fix: pick such a name.")
    _check_role(role)
    _check_password(password)
    users = load_users(path)
    if name in users:
        raise MLOpsError(f"user '{name}' already exists in {path}. Fix: use `mlops registry user passwd {name}`.")
    users[name] = {"role": role, "password_hash": _hasher().hash(password)}
    _save(users, path)
    return Identity(name, role)


def set_password(name: str, password: str, path: Path | None = None, *, role: str | None = None) -> Identity:
    path = path or identities_path()
    users = load_users(path)
    if name not in users:
        raise NotFoundError(f"user '{name}' does not exist: {did_you_mean(name, users)}. "
                            f"Fix: add it with `mlops registry user add {name} --role ...`.")
    _check_password(password)
    if role is not None:
        _check_role(role)
        users[name]["role"] = role
    users[name]["password_hash"] = _hasher().hash(password)
    _save(users, path)
    return Identity(name, users[name]["role"])


def list_users(path: Path | None = None) -> list[Identity]:
    return [Identity(n, u.get("role", "viewer")) for n, u in sorted(load_users(path).items())]


def authenticate(name: str | None, password: str | None, path: Path | None = None) -> Identity:
    """The identity for a name and password; AuthError (same message for unknown user and wrong password)."""
    from argon2.exceptions import InvalidHashError, VerificationError

    path = path or identities_path()
    if not name:
        raise AuthError(f"no identity given. Fix: set {USER_ENV} and {PASSWORD_ENV} (users are listed by "
                        "`mlops registry user list`).")
    users = load_users(path)
    user = users.get(name)
    refused = AuthError(f"authentication failed for '{name}': unknown user or wrong password ({path}). "
                        f"Fix: check {USER_ENV} and {PASSWORD_ENV}, or ask an admin to reset it with "
                        f"`mlops registry user passwd {name}`.")
    if user is None or not password:
        raise refused
    try:
        _hasher().verify(user.get("password_hash", ""), password)
    except (VerificationError, InvalidHashError):
        raise refused from None
    return Identity(name, user.get("role", "viewer"))


def require(identity: Identity, action: str) -> Identity:
    if not identity.can(action):
        allowed = sorted(r for r, p in PERMISSIONS.items() if action in p)
        raise AuthError(f"'{identity.name}' has role '{identity.role}', which may not {action.replace('_', ' ')}. "
                        f"Roles that may: {', '.join(allowed)}. Fix: act as such an identity, or ask an admin to "
                        "change the role.")
    return identity


def from_env(action: str | None = None, path: Path | None = None) -> Identity:
    """The acting identity from MLOPS_USER / MLOPS_PASSWORD, checked for `action` when given."""
    identity = authenticate(os.environ.get(USER_ENV, "").strip(), os.environ.get(PASSWORD_ENV), path)
    return require(identity, action) if action else identity


def acting_name() -> str | None:
    """Who is acting, for the `mlops.actor` lineage tag: MLOPS_USER, verified when a password is given."""
    name = os.environ.get(USER_ENV, "").strip()
    if not name:
        return None
    if os.environ.get(PASSWORD_ENV):
        authenticate(name, os.environ.get(PASSWORD_ENV))
    return name
