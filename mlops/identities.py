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
from itertools import pairwise
from typing import Any

from mlops.errors import MLOpsError, did_you_mean

USER_ENV = "MLOPS_USER"
PASSWORD_ENV = "MLOPS_PASSWORD"
# service: a CI or evaluation identity an admin registers: it runs steps and attests their evidence, nothing more.
ROLES = ("viewer", "service", "trainer", "approver", "admin")
NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{1,39}$")

# What each role may do. One table: the CLI, the app and the registry all ask `can(...)`.
PERMISSIONS: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "service": frozenset({"read", "train"}),
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


PASSPHRASE_MIN = 12
PASSPHRASE_LONG = 20  # this long, length alone makes it strong, whatever characters it uses
PASSPHRASE_CLASSES = 3  # else: of lower case, upper case, digits and symbols, at least this many
# Neighbouring characters: the alphabet, the digits and the keyboard's rows (a step along one is a "run").
_SEQUENCES = ("abcdefghijklmnopqrstuvwxyz", "01234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm")
_NEIGHBOURS = frozenset(pair for seq in _SEQUENCES for a, b in pairwise(seq) for pair in ((a, b), (b, a)))
_FIX = (f"Fix: choose a passphrase of {PASSPHRASE_MIN}+ characters mixing {PASSPHRASE_CLASSES} of lower case, "
        f"upper case, digits and symbols (or {PASSPHRASE_LONG}+ characters of any kind), without your user name, "
        "e.g. three unrelated words joined by '-' with a number.")


def check_password(password: str, name: str | None = None) -> None:
    """Refuse a weak key passphrase, naming the rule it breaks and the fix. The message never quotes it: it ends
    up in terminals and logs. `name`: the user whose key it seals, when known."""
    problem = _passphrase_problem(password or "", name)
    if problem:
        raise MLOpsError(f"the passphrase {problem}. {_FIX}")


def _passphrase_problem(password: str, name: str | None) -> str | None:
    if len(password) < PASSPHRASE_MIN:
        return f"is shorter than {PASSPHRASE_MIN} characters"
    # A name of two letters turns up inside ordinary words; from three on it is a guesser's first try.
    if name and len(name) >= 3 and name.lower() in password.lower():
        return f"contains the user name '{name}'"
    if _repeats_a_short_pattern(password):
        return "is one character or a short pattern repeated (like aaaa or abab)"
    if _longest_run(password.lower()) * 2 > len(password):
        return "is mostly a simple run (like abcd, 4321 or qwerty)"
    classes = _character_classes(password)
    if classes < PASSPHRASE_CLASSES and len(password) < PASSPHRASE_LONG:
        return (f"mixes only {classes} of the 4 kinds of character (lower case, upper case, digits, symbols) and "
                f"is shorter than {PASSPHRASE_LONG} characters")
    return None


def _repeats_a_short_pattern(text: str) -> bool:
    """`text` is its first few characters (at most a third of it) over and over."""
    return any((text[:size] * (len(text) // size + 1))[:len(text)] == text for size in range(1, len(text) // 3 + 1))


def _longest_run(text: str) -> int:
    """The most characters in a row that step through a sequence (or repeat one character)."""
    longest = current = 1
    for a, b in pairwise(text):
        current = current + 1 if a == b or (a, b) in _NEIGHBOURS else 1
        longest = max(longest, current)
    return longest


def _character_classes(text: str) -> int:
    return sum((any(c.islower() for c in text), any(c.isupper() for c in text), any(c.isdigit() for c in text),
                any(not c.isalnum() for c in text)))


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
