"""Layer 5 (readers): reading the ledger: status, history (what was in production at time T), who approved, verify and drift."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlops.lineage import Tag
from registry.state import ModelState, replay
from registry.transition import STAGE_TAG, alias_drift


@dataclass
class Verification:
    chain: list[str] = field(default_factory=list)
    drift: dict[str, list[str]] = field(default_factory=dict)
    entries: int = 0

    @property
    def ok(self) -> bool:
        return not self.chain and not any(self.drift.values())

    def as_dict(self) -> dict:
        return {"ok": self.ok, "entries": self.entries, "chain": self.chain, "drift": self.drift}


def model_state(model: str, *, until: str | None = None, url: str | None = None) -> ModelState:
    """A model's state from the verified ledger (LedgerBroken when the chain does not verify)."""
    from registry.resolve import verified_state

    return verified_state(model, until=until, url=url)


def models(url: str | None = None) -> list[str]:
    from registry.ledger import verified
    from registry.resolve import known_models

    return known_models(verified(url).entries)


def drift(state: ModelState) -> list[str]:
    """Every alias, stage tag or gate tag in MLflow that differs from the ledger's word: the one drift check
    (acts, `verify`, `status`, the follower and the app all call it or `alias_drift`)."""
    from mlops.tracking import call, client
    from registry.gates import newest_gate_report
    from registry.transition import flush_display

    flush_display()
    problems = alias_drift(state)
    c = client()
    for version, vs in sorted(state.versions.items(), key=lambda kv: int(kv[0])):
        tags = dict(call(f"version {state.model}/{version}", c.get_model_version, state.model, version).tags)
        if tags.get(STAGE_TAG) != vs.stage:
            problems.append(f"version {version}: tag {STAGE_TAG}={tags.get(STAGE_TAG)} but the ledger says {vs.stage}")
        shown = tags.get(Tag.GATE_EVAL)
        if shown and vs.content_id:
            found = newest_gate_report(vs.content_id)
            stored = found[1].get("result") if found else None
            if shown != stored:
                problems.append(f"version {version}: tag {Tag.GATE_EVAL}={shown} but the stored gate report says "
                                f"{stored or 'nothing'}")
    return problems


def chain_check(url: str | None = None):
    """(the chain as stored, its problems): hashes, links, head, pinned head and anchor, signatures, every rule."""
    from registry import ledger
    from registry.trust import advance_anchor

    db = ledger.ledger_url(url)
    with ledger.db_errors(db), ledger.reader(db).connect() as conn:
        chain = ledger.read_chain(conn, db)
    problems = ledger.problems_of(chain)
    if not problems:
        advance_anchor(chain.registry_id, chain.head_seq, chain.head_hash)
    return chain, problems


def verify(model: str | None = None, url: str | None = None) -> Verification:
    """The whole chain intact (hashes, links, head, anchor and pinned head, signatures, every rule) and MLflow agreeing with the
    ledger, for `model` or every model. A model the ledger does not know is NotFoundError."""
    from registry import ledger
    from registry.resolve import known_models, require_model

    db = ledger.ledger_url(url)
    chain, problems = chain_check(db)
    result = Verification(chain=problems, entries=len(chain.entries))
    if problems:
        return result  # nothing replayed from a broken chain is worth comparing
    if model is not None:
        require_model(model, url=db)
    for name in [model] if model else known_models(chain.entries):
        result.drift[name] = drift(replay(name, chain.entries))
    return result


def history(model: str, at: str | None = None, url: str | None = None) -> dict:
    """Alias moves up to `at` (ISO UTC), and which version held each alias at that time."""
    from registry import ledger
    from registry.resolve import require_model

    cut = normalize_time(at) if at else None
    require_model(model, url=url)
    mine = ledger.verified(url).of(model)
    moves = [e.as_dict() for e in mine if e.alias and (cut is None or e.ts <= cut)]
    state = replay(model, mine, until=cut)
    return {"model": model, "at": cut, "aliases": dict(state.aliases), "moves": moves}


def normalize_time(text: str) -> str:
    """An ISO time (any offset, or naive = UTC) as the ledger's UTC form, for ordered comparison."""
    from datetime import UTC, datetime

    from registry.transition import RefusedError

    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise RefusedError(f"--at '{text}' is not an ISO time. Fix: pass e.g. 2026-11-30T18:00:00Z.") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def who_approved(model: str, version: str, url: str | None = None) -> list[dict]:
    from registry import ledger
    from registry.resolve import require_model, require_version

    require_version(require_model(model, url=url), version)
    return [{"approver": e.actor, "ts": e.ts, "comment": e.reason, "to_stage": e.to_stage, "seq": e.seq}
            for e in ledger.verified(url).of(model) if e.action == "approve" and e.version == str(version)]


def status(model: str, url: str | None = None) -> dict:
    """Versions with stage, aliases, gate status (from stored reports) and pending approvals."""
    from registry.gates import newest_gate_report
    from registry.resolve import require_model

    state = require_model(model, url=url)
    versions = []
    for version, vs in sorted(state.versions.items(), key=lambda kv: int(kv[0]), reverse=True):
        found = newest_gate_report(vs.content_id) if vs.content_id else None
        versions.append({"version": version, "stage": vs.stage, "aliases": sorted(a for a, v in state.aliases.items()
                                                                                  if v == version),
                         "registered_by": vs.registered_by, "trainer": vs.trainer,
                         "gate": found[1].get("result") if found else "not run",
                         "overrides": vs.overrides, "stage_reason": vs.stage_reason})
    pending = [{"seq": r.seq, "version": r.version, "to": r.to_stage, "requester": r.requester,
                "comment": r.comment, "ts": r.ts} for r in state.pending()]
    return {"model": model, "aliases": dict(state.aliases), "versions": versions, "pending": pending,
            "drift": drift(state)}
