"""Layer 2 (the pure replay): every rule of the registry, checked on every entry, by the writer and every verifier.

`registry.ledger.audited` walks the whole ledger once with these functions: each entry's signature must be its actor's key as the ledger
stood just before it (the first entry's, the pinned root), and the act must be one that actor was allowed to do
on the state the entries before it built: roles, the lifecycle, four-eyes, requests, passing gates, canary bounds,
digests of the files it names. An entry that breaks a rule is refused even when a valid key signed it (a key
holder who bypassed the library). `registry.transition.run` checks each new entry with the same `problem()`
before it signs and appends it, so the writer and the verifiers can never disagree. No I/O here.
"""

from __future__ import annotations

from mlops.identities import PERMISSIONS, ROLES
from registry.entries import GOVERNANCE, Entry
from registry.model_rules import MODEL_RULES, four_eyes_conflicts, released_gguf  # noqa: F401 - the rules' API
from registry.refusal import RefusedError  # noqa: F401 - where callers import it from
from registry.signing import fingerprint, statement, verify
from registry.state import apply
from registry.world import User, World, attested  # noqa: F401 - the rules' API

GATES = ("lineage", "data", "eval", "contamination", "spot_check", "shadow")
# What each action needs of its actor (mlops.identities.PERMISSIONS decides who has it).
NEEDS = {"policy": "manage_policy", "user_add": "manage_users", "user_remove": "manage_users",
         "register": "register", "package": "register", "request": "request", "approve": "approve",
         "reject": "approve", "promote": "promote", "rollback": "rollback", "override": "override",
         "reconcile": "reconcile", "canary_start": "promote", "canary_stop": "promote",
         "spot_check": "spot_check", "spot_check_review": "spot_check"}


def signature_problem(world: World, e: Entry, registry_id: str, root: str) -> str | None:
    if e.action == "bootstrap":
        public = str(e.evidence.get("public_key") or "")
        if not _is_key(public) or fingerprint(public) != root:
            return "its key is not the pinned trust root (a registry started by someone else)"
    else:
        user = world.users.get(e.actor)
        if user is None:
            return "it is signed in the name of no identity the ledger holds"
        public = user.public_key
    if not verify(public, statement(registry_id, e.hash), e.signature or ""):
        return "its signature is not its actor's (forged, or signed with another key)"
    return None


def problem(world: World, e: Entry) -> str | None:
    """Why the rules refuse entry `e` on the state `world` (None: allowed)."""
    if e.action == "bootstrap":
        return None if world.count == 0 and e.evidence.get("role") == "admin" and e.actor == e.evidence.get(
            "name") else "a bootstrap is the ledger's first entry, by the admin it creates"
    actor = world.users.get(e.actor)
    need = NEEDS.get(e.action)
    if e.action == "user_update":
        need = None if _own_key_change(world, e) else "manage_users"
    if actor is None:
        return f"'{e.actor}' is no identity in the registry"
    if need and need not in PERMISSIONS.get(actor.role, ()):
        return f"'{e.actor}' has role {actor.role}, which may not {need.replace('_', ' ')}"
    check = GOVERNANCE_RULES.get(e.action) if e.model == GOVERNANCE else MODEL_RULES.get(e.action)
    if check is None:
        return f"'{e.action}' is no act the registry knows in this stream"
    return check(world, e)


def advance(world: World, e: Entry) -> None:
    """Apply an entry (already judged) to the world."""
    world.count += 1
    if e.model == GOVERNANCE:
        ev = e.evidence
        if e.action in ("bootstrap", "user_add", "user_update"):
            world.users[ev["name"]] = User(ev["name"], ev["role"], ev["public_key"])
        elif e.action == "user_remove":
            world.users.pop(ev.get("name"), None)
        elif e.action == "policy":
            world.policy = ev.get("policy")
            world.evidence_rules = world.evidence_rules or "attestors" in (world.policy or {})
        return
    state = world.model(e.model)
    apply(state, e)
    state.last_seq = e.seq


# --------------------------------------------------------------------------- governance


def users_in(entries) -> dict[str, User]:
    """Every identity the governance entries define, as of the newest one (entries already verified)."""
    world = World()
    for e in entries:
        if e.model == GOVERNANCE and e.action in ("bootstrap", "user_add", "user_update", "user_remove"):
            advance(world, e)
    return world.users


def _is_key(text: str) -> bool:
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _identity_fields(e: Entry) -> str | None:
    ev = e.evidence
    if ev.get("role") not in ROLES:
        return f"role {ev.get('role')} does not exist"
    if not _is_key(ev.get("public_key", "")):
        return "it records no Ed25519 public key"
    return None


def _own_key_change(world: World, e: Entry) -> bool:
    user = world.users.get(e.actor)
    return bool(user and e.evidence.get("name") == e.actor and e.evidence.get("role") == user.role)


def _user_add(world: World, e: Entry) -> str | None:
    if e.evidence.get("name") in world.users:
        return f"user {e.evidence.get('name')} exists already"
    return _identity_fields(e)


def _user_update(world: World, e: Entry) -> str | None:
    if e.evidence.get("name") not in world.users:
        return f"user {e.evidence.get('name')} does not exist"
    return _identity_fields(e)


def _user_remove(world: World, e: Entry) -> str | None:
    name = e.evidence.get("name")
    if name not in world.users:
        return f"user {name} does not exist"
    return "an admin may not remove themselves" if name == e.actor else None


def _policy(world: World, e: Entry) -> str | None:
    policy = e.evidence.get("policy")
    if not isinstance(policy, dict):
        return "no policy"
    if attested(world) and "attestors" not in policy:
        return "it records no attestors, which would switch off the evidence rules this registry holds"
    return None


GOVERNANCE_RULES = {"policy": _policy,
                    "user_add": _user_add, "user_update": _user_update, "user_remove": _user_remove}
