"""Layer 2 (the pure replay): the rules of a model's release stream: registration, packages, requests, approvals,
promotions, rollbacks, canaries and spot-check reviews, each judged on the state the entries before it built.

`registry.rules.problem` dispatches an entry here after its actor's role was checked; the gates an approval or a
promotion stands on are re-derived by `registry.derive`. No I/O here.
"""

from __future__ import annotations

from mlops.identities import PERMISSIONS
from registry.derive import required_gates
from registry.entries import Entry, digest_of
from registry.state import ALIAS_OF_STAGE, DISPLACED_TO, TRANSITIONS, ModelState
from registry.world import World, attested


def _version(state: ModelState, e: Entry):
    return state.versions.get(str(e.version))


def _register(world: World, e: Entry) -> str | None:
    from mlops.model_refs import content_id_of_files

    state = world.model(e.model)
    if not e.version or e.version in state.versions:
        return f"version {e.version} is registered already"
    files = e.evidence.get("files")
    if not isinstance(files, dict) or not files or e.evidence.get("files_digest") != digest_of(files):
        return "it records no digest manifest of the model's files"
    if e.to_stage != "candidate":
        return "a version is registered as a candidate"
    if not attested(world):
        return None
    if e.evidence.get("content_id") != content_id_of_files(files):
        return (f"its content id {e.evidence.get('content_id')} is not the one its signed file list derives "
                f"({content_id_of_files(files)})")
    return _training_proven(world, e)


def _training_proven(world: World, e: Entry) -> str | None:
    """A training attestation over exactly these files, by its trainer; or an admin's ledgered override."""
    from registry.derive import opened

    ev = e.evidence
    unattested = ev.get("unattested")
    if unattested is not None:
        actor = world.users.get(e.actor)
        if actor is None or "override" not in PERMISSIONS.get(actor.role, ()):
            return "an unattested training run is registered only by an admin's override"
        if not str((unattested or {}).get("reason") or "").strip() or ev.get("trainer") is not None:
            return "an unattested registration records the admin's reason and no trainer"
        return None
    att, why = opened(world.users, world.policy, (ev.get("attestations") or {}).get("train"), "train",
                      ev.get("files"))
    if att is None:
        return why
    if att.predicate.get("run_id") != ev.get("run_id"):
        return f"its training attestation is of run {att.predicate.get('run_id')}, not {ev.get('run_id')}"
    if ev.get("trainer") != att.signer:
        return f"it names {ev.get('trainer')} as trainer, but {att.signer} attested the training"
    return None


def _package(world: World, e: Entry) -> str | None:
    from registry.derive import opened

    vs = _version(world.model(e.model), e)
    if vs is None:
        return f"version {e.version} is not registered"
    sha = str(e.evidence.get("sha256") or "")
    if len(sha) != 64 or not e.evidence.get("quantization"):
        return "it records no GGUF sha256 and quantization"
    if not attested(world):
        return None
    if vs.stage != "candidate":
        return (f"version {e.version} is {vs.stage}: the bytes it serves were fixed at its approval, and a new "
                "package needs a new registration and approval")
    if e.evidence.get("content_id") != vs.content_id:
        return f"it names content id {e.evidence.get('content_id')}, but v{e.version} is {vs.content_id}"
    att, why = opened(world.users, world.policy, (e.evidence.get("attestations") or {}).get("package"), "package")
    if att is None:
        return why
    if att.signer != e.actor or sha not in att.subjects.values() or \
            att.predicate.get("files_digest") != vs.evidence.get("files_digest"):
        return "its package attestation is not the packager's, of this GGUF, from this version's files"
    return None


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


def gates_problem(world: World, state: ModelState, e: Entry) -> str | None:
    """Every gate the recorded policy requires, re-derived from the attestations the entry names
    (`registry.derive`); before the evidence rules, the gates the entry records, each passed or overridden."""
    if attested(world):
        from registry.derive import gates_problem as derived_problem

        vs = _version(state, e)
        return derived_problem(world.users, world.policy, state, vs, e.evidence) if vs else "no such version"
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
    if req.to_stage != "production":
        return None
    return _fixed_gguf_problem(world, state, e) or gates_problem(world, state, e)


def released_gguf(vs) -> dict | None:
    """The GGUF a version's newest package names ({seq, sha256, quantization}); None when never packaged."""
    if not vs or not vs.packages:
        return None
    last = vs.packages[-1]
    return {"seq": last["seq"], "sha256": last["sha256"], "quantization": last["quantization"]}


def _fixed_gguf_problem(world: World, state: ModelState, e: Entry) -> str | None:
    """An approval fixes the bytes production will serve: the GGUF packaged when it was given."""
    if attested(world) and e.evidence.get("gguf") != released_gguf(_version(state, e)):
        return f"it fixes GGUF {e.evidence.get('gguf')}, but the version's package in force is " \
               f"{released_gguf(_version(state, e))}"
    return None


def _alias_move(state: ModelState, e: Entry) -> str | None:
    alias = ALIAS_OF_STAGE.get(e.to_stage or "")
    if alias is None or e.alias != alias or e.alias_after != str(e.version):
        return f"it moves @{e.alias} to {e.alias_after} for a move of v{e.version} to {e.to_stage}"
    if e.alias_before != state.aliases.get(alias):
        return f"it says @{alias} was {e.alias_before}, but the ledger says {state.aliases.get(alias)}"
    return None


def _evidence_of_move(state: ModelState, e: Entry, displaced_to: str | None) -> str | None:
    """A move's evidence says what the replayed state says: whom it displaced, where to, which aliases it freed."""
    current = state.aliases.get(e.alias or "")
    released = sorted(a for a, v in state.aliases.items() if v == str(e.version) and a != e.alias)
    ev = e.evidence
    if ev.get("displaced") != current or ev.get("displaced_to") != (displaced_to if current else None):
        return f"its evidence says it displaced {ev.get('displaced')} to {ev.get('displaced_to')}, but the ledger " \
               f"says @{e.alias} was {current}"
    if sorted(ev.get("released_aliases") or []) != released:
        return f"its evidence frees aliases {ev.get('released_aliases')}, but the version holds {released}"
    return None


def _promote(world: World, e: Entry) -> str | None:
    state = world.model(e.model)
    bad = _alias_move(state, e) or _allowed_move(state, e)
    if bad:
        return bad
    if attested(world):
        bad = _evidence_of_move(state, e, DISPLACED_TO.get(e.to_stage or ""))
        if bad:
            return bad
    if e.to_stage != "production":
        return None
    approved = state.approved_request(str(e.version), "production")
    if approved is None or approved.seq != e.evidence.get("request_seq"):
        return "no approved request to production stands behind it"
    if attested(world) and approved.decision.get("gguf") != released_gguf(_version(state, e)):
        return "the version was packaged again after its approval: the bytes it would serve need a new approval"
    return gates_problem(world, state, e)


def _rollback(world: World, e: Entry) -> str | None:
    state = world.model(e.model)
    bad = _alias_move(state, e)
    vs = _version(state, e)
    if bad or vs is None:
        return bad or f"version {e.version} is not registered"
    if vs.stage != "archived" or str(e.version) not in state.production_stack:
        return f"version {e.version} is {vs.stage}: a rollback brings back a former champion only"
    return _evidence_of_move(state, e, "rolled_back") if attested(world) else None


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
    until = e.evidence.get("until")
    if attested(world) and (not isinstance(until, int | float) or not abs(until - (_epoch(e.ts) + seconds)) <= CLOCK_SLACK):
        return f"it runs until {until}, which is not its start ({e.ts}) plus its {seconds}s"
    limits = e.evidence.get("limits") or {}
    policy_limits = {k: getattr(bounds, k) for k in ("max_error_rate", "max_p95_ratio", "min_requests")}
    if {k: limits.get(k) for k in policy_limits} != policy_limits:
        return "its thresholds are not the recorded policy's"
    return None


CLOCK_SLACK = 5.0  # seconds between a canary's planned start and its entry's timestamp


def _epoch(ts: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except (AttributeError, ValueError):
        return float("nan")


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
