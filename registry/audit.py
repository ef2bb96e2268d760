"""Reading the ledger: status, history (what was in production at time T), who approved, verify and drift."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlops.lineage import Tag
from registry.state import ModelState, replay

STAGE_TAG = "registry.stage"


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
    from registry import ledger

    return replay(model, ledger.entries(model, url), until=until)


def models(url: str | None = None) -> list[str]:
    from registry import ledger

    return sorted({e.model for e in ledger.entries(None, url)})


def drift(state: ModelState) -> list[str]:
    """Every alias, stage tag or gate tag in MLflow that differs from the ledger's word."""
    from mlops.model_refs import call, client
    from registry.gates import newest_gate_report
    from registry.transition import flush_display, registry_aliases

    flush_display()
    problems = []
    actual = registry_aliases(state.model)
    for alias in sorted(set(actual) | set(state.aliases)):
        if alias in ("staging", "production") and actual.get(alias) != state.aliases.get(alias):
            problems.append(f"@{alias} points to {actual.get(alias) or 'nothing'} in MLflow but the ledger says "
                            f"{state.aliases.get(alias) or 'nothing'}")
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


def verify(model: str | None = None, url: str | None = None) -> Verification:
    """The chain intact (no edited, inserted or deleted entry) and MLflow agreeing with the ledger."""
    from registry import ledger

    everything = ledger.entries(None, url)
    seq, head_hash = ledger.head(url)
    result = Verification(chain=ledger.chain_problems(everything, seq, head_hash), entries=len(everything))
    for name in [model] if model else sorted({e.model for e in everything}):
        result.drift[name] = drift(replay(name, everything))
    return result


def history(model: str, at: str | None = None, url: str | None = None) -> dict:
    """Alias moves up to `at` (ISO UTC), and which version held each alias at that time."""
    from registry import ledger

    cut = normalize_time(at) if at else None
    moves = [e.as_dict() for e in ledger.entries(model, url) if e.alias and (cut is None or e.ts <= cut)]
    state = replay(model, ledger.entries(model, url), until=cut)
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

    return [{"approver": e.actor, "ts": e.ts, "comment": e.reason, "to_stage": e.to_stage, "seq": e.seq}
            for e in ledger.entries(model, url) if e.action == "approve" and e.version == str(version)]


def status(model: str, url: str | None = None) -> dict:
    """Versions with stage, aliases, gate status (from stored reports) and pending approvals."""
    from registry.gates import newest_gate_report

    state = model_state(model, url=url)
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
    return {"model": model, "aliases": dict(state.aliases), "versions": versions, "pending": pending}
