"""Layer 2 (the pure replay): every rule of the registry, checked on every entry, by the writer and every verifier.

`registry.ledger.audited` walks the whole ledger once with these functions: each entry's signature must be its actor's key as the ledger
stood just before it (the first entry's, the pinned root), and the act must be one that actor was allowed to do
on the state the entries before it built: roles, the lifecycle, four-eyes, requests, passing gates, canary bounds,
digests of the files it names. An entry that breaks a rule is refused even when a valid key signed it (a key
holder who bypassed the library). `registry.transition.run` checks each new entry with the same `problem()`
before it signs and appends it, so the writer and the verifiers can never disagree. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlops.errors import MLOpsError
from mlops.identities import PERMISSIONS, ROLES
from registry.entries import GOVERNANCE, Entry, digest_of
from registry.signing import fingerprint, statement, verify
from registry.state import ALIAS_OF_STAGE, TRANSITIONS, ModelState, apply

BASE_GATES = ("lineage", "data", "eval", "contamination")
GATES = (*BASE_GATES, "spot_check", "shadow")
# What each action needs of its actor (mlops.identities.PERMISSIONS decides who has it).
NEEDS = {"policy": "manage_policy", "user_add": "manage_users", "user_remove": "manage_users",
         "register": "register", "package": "register", "request": "request", "approve": "approve",
         "reject": "approve", "promote": "promote", "rollback": "rollback", "override": "override",
         "reconcile": "reconcile", "canary_start": "promote", "canary_stop": "promote",
         "spot_check": "spot_check", "spot_check_review": "spot_check"}


class RefusedError(MLOpsError):
    """A transition the rules refuse; nothing was changed."""


@dataclass(frozen=True)
class User:
    name: str
    role: str
    public_key: str


@dataclass
class World:
    """The ledger's state after some entries: identities, the policy in force, every model's release state."""

    users: dict[str, User] = field(default_factory=dict)
    policy: dict | None = None
    models: dict[str, ModelState] = field(default_factory=dict)
    count: int = 0

    def model(self, name: str) -> ModelState:
        if name not in self.models:
            self.models[name] = ModelState(name)
        return self.models[name]


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


GOVERNANCE_RULES = {"policy": lambda w, e: None if isinstance(e.evidence.get("policy"), dict) else "no policy",
                    "user_add": _user_add, "user_update": _user_update, "user_remove": _user_remove}


# --------------------------------------------------------------------------- releases


def _version(state: ModelState, e: Entry):
    return state.versions.get(str(e.version))


def _register(world: World, e: Entry) -> str | None:
    state = world.model(e.model)
    if not e.version or e.version in state.versions:
        return f"version {e.version} is registered already"
    files = e.evidence.get("files")
    if not isinstance(files, dict) or not files or e.evidence.get("files_digest") != digest_of(files):
        return "it records no digest manifest of the model's files"
    return None if e.to_stage == "candidate" else "a version is registered as a candidate"


def _package(world: World, e: Entry) -> str | None:
    if _version(world.model(e.model), e) is None:
        return f"version {e.version} is not registered"
    sha = str(e.evidence.get("sha256") or "")
    return None if len(sha) == 64 and e.evidence.get("quantization") else "it records no GGUF sha256 and quantization"


def _allowed_move(state: ModelState, e: Entry) -> str | None:
    vs = _version(state, e)
    if vs is None:
        return f"version {e.version} is not registered"
    if e.to_stage not in TRANSITIONS.get(vs.stage, ()):
        return f"version {e.version} is {vs.stage} and may not move to {e.to_stage}"
    return None


def _request(world: World, e: Entry) -> str | None:
    state = world.model(e.model)
    if state.open_request(str(e.version), e.to_stage):
        return "the version already has an open request to that stage"
    return _allowed_move(state, e)


def four_eyes_conflicts(state: ModelState, version: str, approver: str, requester: str | None) -> list[str]:
    """Who may not approve a version: whoever trained (as claimed by the run), registered or requested it."""
    vs = state.versions.get(str(version))
    roles = {"trained": vs.trainer if vs else None, "registered": vs.registered_by if vs else None,
             "requested": requester}
    return [what for what, who in roles.items() if who and who == approver]


def required_gates(policy: dict | None) -> list[str]:
    policy = policy or {}
    extra = [g for g in ("spot_check", "shadow") if (policy.get(g) or {}).get("required")]
    return [*BASE_GATES, *extra]


def gates_problem(world: World, state: ModelState, e: Entry) -> str | None:
    """The gates recorded in the entry: every one the recorded policy requires, each passed or overridden by an
    override entry of this version."""
    recorded = {g.get("gate"): g for g in e.evidence.get("gates") or [] if isinstance(g, dict)}
    vs = _version(state, e)
    override_seqs = {o.get("seq") for o in (vs.overrides if vs else [])}
    for gate in required_gates(world.policy):
        found = recorded.get(gate)
        if found is None:
            return f"it records no result of the {gate} gate"
        if not found.get("passed") and (found.get("overridden_by") or {}).get("seq") not in override_seqs:
            return f"the {gate} gate it records did not pass and no override covers it"
    return None


def _pending(state: ModelState, e: Entry):
    seq = e.evidence.get("request_seq")
    found = [r for r in state.pending() if r.seq == seq and r.version == str(e.version)]
    return found[0] if found else None


def _decide(world: World, e: Entry) -> str | None:
    state = world.model(e.model)
    req = _pending(state, e)
    if req is None:
        return "it decides no pending request of this version"
    if e.action == "reject":
        return None
    conflicts = four_eyes_conflicts(state, str(e.version), e.actor, req.requester)
    if conflicts:
        return f"four-eyes rule: {e.actor} {' and '.join(conflicts)} this version"
    return gates_problem(world, state, e) if req.to_stage == "production" else None


def _alias_move(state: ModelState, e: Entry) -> str | None:
    alias = ALIAS_OF_STAGE.get(e.to_stage or "")
    if alias is None or e.alias != alias or e.alias_after != str(e.version):
        return f"it moves @{e.alias} to {e.alias_after} for a move of v{e.version} to {e.to_stage}"
    if e.alias_before != state.aliases.get(alias):
        return f"it says @{alias} was {e.alias_before}, but the ledger says {state.aliases.get(alias)}"
    return None


def _promote(world: World, e: Entry) -> str | None:
    state = world.model(e.model)
    bad = _alias_move(state, e) or _allowed_move(state, e)
    if bad or e.to_stage != "production":
        return bad
    approved = state.approved_request(str(e.version), "production")
    if approved is None or approved.seq != e.evidence.get("request_seq"):
        return "no approved request to production stands behind it"
    return gates_problem(world, state, e)


def _rollback(world: World, e: Entry) -> str | None:
    state = world.model(e.model)
    bad = _alias_move(state, e)
    vs = _version(state, e)
    if bad or vs is None:
        return bad or f"version {e.version} is not registered"
    if vs.stage != "archived" or str(e.version) not in state.production_stack:
        return f"version {e.version} is {vs.stage}: a rollback brings back a former champion only"
    return None


def _canary_start(world: World, e: Entry) -> str | None:
    from registry.config import policy_of

    state = world.model(e.model)
    vs = _version(state, e)
    if vs is None or vs.stage not in ("staging", "candidate") or state.canary:
        return "a canary starts on a staging or candidate version, one at a time"
    approved = state.approved_request(str(e.version), "production")
    if approved is None or approved.seq != e.evidence.get("request_seq"):
        return "a canary needs an approved request to production (four-eyes)"
    bounds = policy_of(world.policy).canary
    share, seconds = e.evidence.get("share"), e.evidence.get("seconds")
    if not isinstance(share, int | float) or not 0 < share <= bounds.max_share:
        return f"its share {share} is outside (0, {bounds.max_share}] (the recorded policy)"
    if not isinstance(seconds, int | float) or not 0 < seconds <= bounds.max_seconds:
        return f"its duration {seconds}s is outside (0, {bounds.max_seconds}] (the recorded policy)"
    limits = e.evidence.get("limits") or {}
    policy_limits = {k: getattr(bounds, k) for k in ("max_error_rate", "max_p95_ratio", "min_requests")}
    if {k: limits.get(k) for k in policy_limits} != policy_limits:
        return "its thresholds are not the recorded policy's"
    return None


def _canary_stop(world: World, e: Entry) -> str | None:
    canary = world.model(e.model).canary
    return None if canary and canary.get("version") == str(e.version) else "no canary of that version runs"


def _known_version(world: World, e: Entry) -> str | None:
    return None if _version(world.model(e.model), e) else f"version {e.version} is not registered"


def _spot_review(world: World, e: Entry) -> str | None:
    state = world.model(e.model)
    bad = _known_version(world, e)
    conflicts = four_eyes_conflicts(state, str(e.version), e.actor, None)
    return bad or (f"{e.actor} {' and '.join(conflicts)} this version and may not review it" if conflicts else None)


MODEL_RULES = {"register": _register, "package": _package, "request": _request, "approve": _decide,
               "reject": _decide, "promote": _promote, "rollback": _rollback, "override": _known_version,
               "reconcile": lambda w, e: None, "canary_start": _canary_start, "canary_stop": _canary_stop,
               "spot_check": _known_version, "spot_check_review": _spot_review}
