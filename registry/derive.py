"""Layer 2 (the pure replay): every release gate, re-derived by every verifier from signed statements alone.

An approval or a promotion to production names the attestations it stands on (their DSSE envelopes, copied
into its signed entry as `evidence.attestations`). The replay opens each one against the keys the ledger holds
at that entry and the recorded policy's `attestors`, checks that its subjects are this version's registered files
(or its snapshot), and decides each required gate itself, against the champion current at that entry:
- lineage:       the registration recorded every required lineage tag;
- data:          a `data` attestation of the version's snapshot: some batch passed GE, none failing admitted;
- eval:          a `gate` attestation of these files: passed, against the champion in production now;
- contamination: the `eval` attestation of the eval that gate stood on: checked, no eval item overlapping;
- spot_check:    (policy) the newest signed review of the version: against the champion now, by someone who
                 neither trained nor registered it, enough items same or better, no unexplained wrong fact;
- shadow:        (policy) a `shadow` attestation of these files: enough shadowed requests, few enough errors.
The entry's own `gates` list is display only: its `passed` claims count for nothing. An admin's ledgered
override of a gate (or `all`) for the version still lets a failing gate pass. No I/O here.
"""

from __future__ import annotations

from registry.attestation import AttestationProblem, open_envelope

BASE_GATES = ("lineage", "data", "eval", "contamination")
GATE_KINDS = {"data": "data", "eval": "gate", "contamination": "eval", "shadow": "shadow"}


def required_gates(policy: dict | None) -> list[str]:
    policy = policy or {}
    extra = [g for g in ("spot_check", "shadow") if (policy.get(g) or {}).get("required")]
    return [*BASE_GATES, *extra]


def attestors_of(policy: dict | None) -> dict:
    from registry.config import policy_of

    return policy_of(policy).attestors.model_dump()


def opened(users: dict, policy: dict | None, envelope, kind: str, files: dict | None = None):
    """(Attestation, None) when `envelope` is evidence of `kind` (about exactly `files`, when given); else
    (None, why not)."""
    if envelope is None:
        return None, f"it names no {kind} attestation"
    try:
        att = open_envelope(envelope, users, attestors_of(policy), kind)
    except AttestationProblem as why:
        return None, f"its {kind} attestation is no evidence: {why}"
    if files is not None and att.subjects != files:
        return None, f"its {kind} attestation (by {att.signer}) is about other files than this version's"
    return att, None


def champion_of(state, version: str):
    """The version in production at this point of the replay, unless it is `version` itself."""
    champion = state.versions.get(state.aliases.get("production", ""))
    return None if champion is None or champion.version == str(version) else champion


def gate_verdicts(users: dict, policy: dict | None, state, vs, attestations: dict) -> dict[str, tuple[bool, str]]:
    """gate -> (passed, why), re-derived from `attestations` (kind -> envelope) for version `vs` now."""
    files = vs.evidence.get("files") or {}
    out = {"lineage": _lineage(vs)}
    data, why = opened(users, policy, attestations.get("data"), "data")
    out["data"] = _data(vs, data) if data else (False, why)
    gate, why = opened(users, policy, attestations.get("gate"), "gate", files)
    out["eval"] = _eval(state, vs, gate) if gate else (False, why)
    ev, why = opened(users, policy, attestations.get("eval"), "eval", files)
    out["contamination"] = _contamination(ev, gate) if ev else (False, why)
    from registry.config import policy_of

    rules = policy_of(policy)
    if rules.shadow.required:
        shadow, why = opened(users, policy, attestations.get("shadow"), "shadow", files)
        out["shadow"] = _shadow(shadow, rules.shadow) if shadow else (False, why)
    if rules.spot_check.required:
        out["spot_check"] = _spot_check(state, vs, rules.spot_check)
    return out


def gates_problem(users: dict, policy: dict | None, state, vs, evidence: dict) -> str | None:
    """Why the gates this entry stands on do not let the version through (None: every required gate passes or
    is overridden by a ledgered override of this version)."""
    verdicts = gate_verdicts(users, policy, state, vs, evidence.get("attestations") or {})
    overridden = {o.get("gate") for o in vs.overrides}
    for gate in required_gates(policy):
        passed, why = verdicts.get(gate, (False, "not derived"))
        if not passed and gate not in overridden and "all" not in overridden:
            return f"the {gate} gate does not pass on the evidence it names: {why}"
    return _judged_gguf_problem(users, policy, vs, evidence) if "gguf" in evidence else None


def _judged_gguf_problem(users: dict, policy: dict | None, vs, evidence: dict) -> str | None:
    """An approval fixes the GGUF the eval judged: one packaged after the eval (or another one) was never
    evaluated in its release form."""
    ev, _ = opened(users, policy, (evidence.get("attestations") or {}).get("eval"), "eval", vs.evidence.get("files"))
    if ev is None or "gguf" not in ev.predicate:
        return None  # no eval that says which artifact it served (an hf release form)
    judged = (ev.predicate.get("gguf") or {}).get("sha256")
    fixed = (evidence.get("gguf") or {}).get("sha256")
    if judged != fixed:
        return (f"it fixes GGUF {str(fixed)[:12]} for serving, but the eval it stands on (run "
                f"{ev.predicate.get('eval_run')}) served {str(judged)[:12]}: re-run the eval on the packaged GGUF")
    return None


def _lineage(vs) -> tuple[bool, str]:
    from mlops.lineage import missing_lineage

    missing = missing_lineage(vs.evidence.get("lineage") or {})
    return (False, f"lineage incomplete at registration: missing {', '.join(missing)}") if missing else \
        (True, "every required lineage tag was recorded at registration")


def _data(vs, att) -> tuple[bool, str]:
    p, snapshot = att.predicate, vs.evidence.get("snapshot_id")
    if p.get("snapshot_id") != snapshot or snapshot not in att.subjects:
        return False, f"the data attestation (by {att.signer}) is about {p.get('snapshot_id')}, not {snapshot}"
    if p.get("admitted_failures"):
        return False, f"batches admitted without passing the GE gate: {p.get('admitted_failures')}"
    if not _number(p.get("passed_batches")):
        return False, "no batch passed the GE gate"
    return True, (f"{_number(p.get('batches')):.0f} batches gated by GE, {_number(p.get('quarantined')):.0f} "
                  f"quarantined, none failing admitted (snapshot {snapshot}, attested by {att.signer})")


def _eval(state, vs, att) -> tuple[bool, str]:
    p = att.predicate
    champion = champion_of(state, vs.version)
    now = champion.content_id if champion else None
    if (p.get("champion") or {}).get("content_id") != now:
        said = (p.get("champion") or {}).get("ref") or "no champion"
        return False, (f"the gate attestation (by {att.signer}) judged against {said}, but the champion now is "
                       f"{'v' + champion.version if champion else 'no champion'}: it is stale")
    if p.get("result") != "passed":
        return False, (f"the gate report (run {p.get('gate_run')}, attested by {att.signer}) failed: "
                       f"{'; '.join(map(str, p.get('reasons') or []))[:600]}")
    return True, f"gate run {p.get('gate_run')} passed (attested by {att.signer})"


def _contamination(ev, gate) -> tuple[bool, str]:
    if gate is None:
        return False, "no attested gate, so no eval whose contamination report to read"
    p = ev.predicate
    if p.get("eval_run") != gate.predicate.get("eval_run"):
        return False, (f"the eval attestation is of eval run {p.get('eval_run')}, but the gate stood on "
                       f"{gate.predicate.get('eval_run')}")
    report = p.get("contamination") or {}
    if report.get("status") != "checked":
        return False, f"contamination was not checked ({report.get('status')})"
    if report.get("offending"):
        return False, (f"{len(report['offending'])} eval items overlap the training snapshot: "
                       f"{', '.join(map(str, report['offending'][:10]))}")
    return True, f"no eval item overlaps the training snapshot (attested by {ev.signer})"


def _shadow(att, policy) -> tuple[bool, str]:
    shadowed, errors = _number(att.predicate.get("shadowed")), _number(att.predicate.get("errors"))
    if shadowed < policy.min_requests:
        return False, f"the candidate answered {shadowed:.0f} shadowed requests; the policy needs {policy.min_requests}"
    if shadowed and errors / shadowed > policy.max_error_rate:
        return False, f"{errors:.0f} of {shadowed:.0f} shadow answers failed"
    return True, f"{shadowed:.0f} shadowed requests (attested by {att.signer})"


def _spot_check(state, vs, policy) -> tuple[bool, str]:
    if not vs.reviews:
        return False, "no signed spot-check review of the version"
    review = vs.reviews[-1]
    ev = review["evidence"]
    champion = champion_of(state, vs.version)
    if str(ev.get("champion") or "") != (champion.version if champion else ""):
        return False, f"the newest spot-check compared against v{ev.get('champion')}: stale"
    own = [r for r in [review["by"], *(ev.get("reviewers") or [])] if r in (vs.trainer, vs.registered_by)]
    if own:
        return False, f"spot-check reviewed by {', '.join(own)}, who trained or registered the version"
    if ev.get("unexplained_wrong_facts"):
        return False, "an item marks a wrong fact in the challenger with no note explaining it"
    if _number(ev.get("share_same_or_better")) < policy.min_share_same_or_better:
        return False, "too few items are at least as good as the champion's"
    return True, f"spot-check review #{review['seq']} passed"


def _number(value) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
