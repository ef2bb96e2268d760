"""Layer 2 (the pure replay): a model's release state, replayed from its ledger entries: stages, aliases, requests, overrides, history.

The ledger is the record; MLflow aliases and `registry.stage` tags are display copies of what this replay says.
The lifecycle is one explicit table (`TRANSITIONS`): anything else is refused with the allowed set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from registry.entries import Entry

STAGES = ("candidate", "staging", "production", "archived", "rolled_back")
ALIAS_OF_STAGE = {"staging": "staging", "production": "production"}
# from-stage -> stages a version may move to. Promotion moves into staging/production; the version it displaces
# leaves by the same entry (production -> archived, staging -> candidate); a rollback moves production ->
# rolled_back and brings an earlier champion (archived) back to production.
TRANSITIONS: dict[str, frozenset[str]] = {
    "candidate": frozenset({"staging", "production", "archived"}),
    "staging": frozenset({"production", "candidate", "archived"}),
    "production": frozenset({"archived", "rolled_back"}),
    "archived": frozenset({"staging", "production"}),
    "rolled_back": frozenset({"staging", "archived"}),
}
DISPLACED_TO = {"production": "archived", "staging": "candidate"}


@dataclass
class Request:
    seq: int
    version: str
    to_stage: str
    requester: str
    comment: str
    ts: str
    status: str = "pending"  # pending, approved, rejected, consumed
    decided_by: str | None = None
    decision_comment: str | None = None
    decided_ts: str | None = None
    decision: dict = field(default_factory=dict)  # the approval's evidence (gates, attestations, the GGUF it fixed)


@dataclass
class VersionState:
    version: str
    stage: str
    registered_by: str
    registered_ts: str
    evidence: dict  # what registration recorded: run, content id, profile, snapshot, data run, lineage
    stage_reason: str | None = None
    overrides: list[dict] = field(default_factory=list)
    # Signed `package` entries ({seq, sha256, quantization, llamacpp_version, by}) and spot-check reviews
    # ({seq, by, evidence}), oldest first: what the replay re-derives the package and spot-check rules from.
    packages: list[dict] = field(default_factory=list)
    reviews: list[dict] = field(default_factory=list)

    @property
    def trainer(self) -> str | None:
        return self.evidence.get("trainer")

    @property
    def content_id(self) -> str | None:
        return self.evidence.get("content_id")


@dataclass
class ModelState:
    model: str
    versions: dict[str, VersionState] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    production_stack: list[str] = field(default_factory=list)  # promotions push, rollbacks pop
    # A running canary: {"version", "share", "until" (epoch s), "seq", "by"}; serving that follows the model
    # routes `share` of its traffic to that version while it is set.
    canary: dict | None = None
    last_seq: int = 0
    # From the ledger's governance stream (filled by `registry.resolve.state_in`): name -> User, and the release
    # policy in force (a `registry:` dict; None = defaults).
    users: dict = field(default_factory=dict)
    policy: dict | None = None
    # The model's own verified ledger entries, oldest first (filled by `registry.resolve.state_in`).
    entries: list[Entry] = field(default_factory=list, repr=False)

    def stage_of(self, version: str) -> str | None:
        state = self.versions.get(str(version))
        return state.stage if state else None

    def pending(self) -> list[Request]:
        return [r for r in self.requests if r.status == "pending"]

    def approved_request(self, version: str, to_stage: str) -> Request | None:
        found = [r for r in self.requests if r.version == str(version) and r.to_stage == to_stage
                 and r.status == "approved"]
        return found[-1] if found else None

    def open_request(self, version: str, to_stage: str) -> Request | None:
        found = [r for r in self.requests if r.version == str(version) and r.to_stage == to_stage
                 and r.status in ("pending", "approved")]
        return found[-1] if found else None


def replay(model: str, entries: list[Entry], *, until: str | None = None) -> ModelState:
    """The state after every entry of `model` (up to and including time `until`, an ISO UTC string)."""
    state = ModelState(model)
    for e in entries:
        if e.model != model or (until is not None and e.ts > until):
            continue
        apply(state, e)
        state.last_seq = e.seq
    return state


def apply(state: ModelState, e: Entry) -> None:
    handler = _HANDLERS.get(e.action)
    if handler:
        handler(state, e)


def _register(state: ModelState, e: Entry) -> None:
    state.versions[e.version] = VersionState(e.version, e.to_stage or "candidate", e.actor, e.ts, dict(e.evidence))


def _request(state: ModelState, e: Entry) -> None:
    state.requests.append(Request(e.seq, e.version, e.to_stage, e.actor, e.reason or "", e.ts))


def _decide(state: ModelState, e: Entry) -> None:
    request_seq = e.evidence.get("request_seq")
    for r in state.requests:
        if r.seq == request_seq:
            r.status = "approved" if e.action == "approve" else "rejected"
            r.decided_by, r.decision_comment, r.decided_ts = e.actor, e.reason, e.ts
            r.decision = dict(e.evidence)


def _move(state: ModelState, e: Entry) -> None:
    """promote / rollback / reconcile: the version takes the alias; whoever held it leaves."""
    if e.alias and e.alias_after is None:
        state.aliases.pop(e.alias, None)
    elif e.alias:
        state.aliases[e.alias] = e.alias_after
    for released in e.evidence.get("released_aliases") or ():
        state.aliases.pop(released, None)
    displaced = e.evidence.get("displaced")
    if displaced and displaced in state.versions:
        state.versions[displaced].stage = e.evidence.get("displaced_to") or DISPLACED_TO.get(e.to_stage, "archived")
        state.versions[displaced].stage_reason = e.reason if e.action == "rollback" else None
    if e.version in state.versions and e.to_stage:
        state.versions[e.version].stage = e.to_stage
        state.versions[e.version].stage_reason = e.reason if e.action != "promote" else None
    if e.alias == "production":
        if e.action == "rollback":
            stack = state.production_stack
            while stack and stack[-1] != e.version:
                stack.pop()
            if not stack:
                stack.append(e.version)
        elif e.alias_after:
            state.production_stack.append(e.alias_after)
    request_seq = e.evidence.get("request_seq")
    for r in state.requests:
        if r.seq == request_seq:
            r.status = "consumed"


def _override(state: ModelState, e: Entry) -> None:
    if e.version in state.versions:
        state.versions[e.version].overrides.append({"gate": e.evidence.get("gate"), "by": e.actor,
                                                    "reason": e.reason, "ts": e.ts, "seq": e.seq})


def _canary_start(state: ModelState, e: Entry) -> None:
    state.canary = {"version": e.version, "share": float(e.evidence.get("share", 0.0)),
                    "until": e.evidence.get("until"), "seq": e.seq, "by": e.actor}


def _canary_stop(state: ModelState, e: Entry) -> None:
    state.canary = None


def _package(state: ModelState, e: Entry) -> None:
    if e.version in state.versions:
        ev = e.evidence
        state.versions[e.version].packages.append({"seq": e.seq, "by": e.actor, **{
            k: ev.get(k) for k in ("sha256", "quantization", "llamacpp_version", "run")}})


def _spot_review(state: ModelState, e: Entry) -> None:
    if e.version in state.versions:
        state.versions[e.version].reviews.append({"seq": e.seq, "by": e.actor, "evidence": dict(e.evidence)})


def _reconcile(state: ModelState, e: Entry) -> None:
    """Reconcile repairs the display copies to the ledger's word; the state itself does not change."""


_HANDLERS = {"register": _register, "request": _request, "approve": _decide, "reject": _decide,
             "promote": _move, "rollback": _move, "override": _override, "reconcile": _reconcile,
             "canary_start": _canary_start, "canary_stop": _canary_stop, "package": _package,
             "spot_check_review": _spot_review}


def rollback_target(state: ModelState) -> str | None:
    """The production version before the current one, stepping further back on each rollback."""
    stack = [v for v in state.production_stack if state.stage_of(v) != "rolled_back"]
    current = state.aliases.get("production")
    earlier = [v for v in stack if v != current]
    return earlier[-1] if earlier else None
