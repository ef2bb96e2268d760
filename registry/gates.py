"""Layer 4 (acts' evidence): release gates, each decided from attested evidence, never from a report a hand can write.

A gate stands on an in-toto statement that the step which made the evidence signed (`registry.attestation`,
stored by `registry.attest_store`), and only one whose signer the recorded policy names for that kind. The
verdicts come from `registry.derive`, the same pure rules every verifier replays over the envelopes an approval
copies into its entry, so the writer and the verifiers can never disagree:
- lineage:       the registration entry in the ledger recorded every required lineage tag.
- data:          the data build's attestation of the snapshot: no failing batch was admitted.
- eval:          the newest attested gate report for these files passed, against the champion current *now*
                 (a report against an earlier champion is stale and must be re-run).
- contamination: the attested contamination report of the eval the gate stood on is clean.
- spot_check:    (when the release policy requires it) the newest ledgered human review of the version passed,
                 against the champion current now, by someone other than its trainer (registry.spotcheck).
- shadow:        (when the release policy requires it) the attested shadow report: enough shadowed requests,
                 few enough errors.
A failing gate names itself and its evidence. An admin override (ledgered, shown forever) lets it pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlops.errors import MLOpsError, NotFoundError
from mlops.lineage import REQUIRED_LINEAGE, Tag, missing_lineage  # noqa: F401 - the gate's vocabulary

GATES = ("lineage", "data", "eval", "contamination", "spot_check", "shadow")


@dataclass
class GateResult:
    gate: str
    passed: bool
    detail: str
    evidence: dict = field(default_factory=dict)
    overridden_by: dict | None = None
    # The DSSE envelope of the attestation the result stood on: what an approval copies into its entry.
    envelope: dict | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.passed or self.overridden_by is not None

    def as_dict(self) -> dict:
        return {"gate": self.gate, "passed": self.passed, "ok": self.ok, "detail": self.detail,
                "evidence": self.evidence, "overridden_by": self.overridden_by}


def lineage_gate(version_state) -> GateResult:
    missing = missing_lineage(version_state.evidence.get("lineage", {}))
    if missing:
        return GateResult("lineage", False, f"lineage incomplete at registration: missing {', '.join(missing)}")
    return GateResult("lineage", True, "every required lineage tag was recorded at registration",
                      {"run_id": version_state.evidence.get("run_id")})


def attested_evidence(state, vs) -> dict[str, tuple]:
    """kind -> (Attestation, envelope): the newest stored statement of each kind about this version (its files,
    or its snapshot) that verifies and whose signer the recorded policy names; the eval is the one the gate
    stood on. A report no permitted identity attested is not here, whoever's run it sits in."""
    from registry.attest_store import usable
    from registry.derive import attestors_of

    attestors, files_key = attestors_of(state.policy), vs.evidence.get("files_digest") or ""
    found = {}
    for kind, key in (("data", vs.evidence.get("snapshot_id") or ""), ("gate", files_key), ("eval", files_key),
                      ("shadow", files_key)):
        stood_on = found["gate"][0].predicate.get("eval_run") if kind == "eval" and "gate" in found else None
        newest = None
        for pair in usable(kind, key, state.users, attestors):
            newest = newest or pair
            if stood_on is None or pair[0].predicate.get("eval_run") == stood_on:
                newest = pair  # the eval the gate stood on, else the newest eval
                break
        if newest:
            found[kind] = newest
    return found


def data_gate(version_state, state) -> GateResult:
    """The snapshot's attested GE results (a follower admits a candidate on this and its lineage)."""
    return _derived(state, version_state, attested_evidence(state, version_state), ("data",))[0]


def _derived(state, vs, found: dict, gates: tuple) -> list[GateResult]:
    from registry.derive import GATE_KINDS, gate_verdicts

    verdicts = gate_verdicts(state.users, state.policy, state, vs, {k: env for k, (_, env) in found.items()})
    out = []
    for gate in gates:
        passed, detail = verdicts.get(gate, (False, "not required"))
        att = found.get(GATE_KINDS.get(gate, ""), (None, None))[0]
        evidence = {**(_kept(att) if att else {}), "attestation": att.id if att else None,
                    "attested_by": att.signer if att else None}
        if gate == "contamination" and att is None and "gate" in found:
            evidence["eval_run"] = found["gate"][0].predicate.get("eval_run")
        if gate == "shadow":  # the policy values it was judged by
            from registry.config import policy_of

            rules = policy_of(state.policy).shadow
            evidence.update(min_requests=rules.min_requests, max_error_rate=rules.max_error_rate)
        attestable = gate in GATE_KINDS and att is None and not passed
        detail = _unattested(gate, state.model, vs, detail) if attestable else detail
        out.append(GateResult(gate, passed, detail, evidence))
    return out


def _kept(att) -> dict:
    """What a gate result shows of its attestation's predicate: the runs and figures (never the envelope)."""
    keep = ("gate_run", "eval_run", "data_run", "shadow_run", "snapshot_id", "result", "shadowed", "errors",
            "report_sha256", "champion", "agreement")
    return {k: att.predicate[k] for k in keep if k in att.predicate}


def _unattested(gate: str, model: str, vs, detail: str) -> str:
    from registry.derive import GATE_KINDS

    kind, version = GATE_KINDS.get(gate, gate), vs.version
    how = {"data": "rebuild the snapshot with `mlops data build`",
           "gate": f"run `mlops gate --challenger models:/{model}/{version} --champion models:/{model}@production`",
           "eval": f"run `mlops eval models:/{model}/{version}`",
           "shadow": f"serve it with `mlops serve --shadow models:/{model}/{version}`, then run `mlops shadow report "
                     f"{model} {version}`"}[kind]
    return (f"no stored {kind} report about v{version} is attested by an identity the release policy names for "
            f"{kind} evidence (a report nobody permitted attested is no evidence; {detail}). Fix: {how}, signed in "
            "(MLOPS_USER, MLOPS_PASSWORD) as such an identity")


def newest_gate_report(content_id: str) -> tuple[str, dict] | None:
    found = _newest_gate_run(content_id)
    return (found[0], found[1]) if found else None


def _newest_gate_run(content_id: str) -> tuple[str, dict, dict] | None:
    """(run id, gate report, the run's tags) of the newest gate run of this content that stored a report."""
    from mlops.run_store import find_runs, load_run_json

    # A report of a run still running (or killed) was never the gate's last word. A refusal is, whatever status
    # the launcher gave its run: `mlflow run` marks FAILED a gate that exits 1 on its own "failed" verdict. A
    # pass counts only from a FINISHED run.
    for run in find_runs({Tag.STAGE: "gate", Tag.MODEL_KEY: content_id}, status=None, max_results=10):
        if run.info.status not in ("FINISHED", "FAILED"):
            continue
        try:
            report = load_run_json(run.info.run_id, "gate/gate_report.json")
        except NotFoundError:
            continue  # a gate run that died before writing its report
        if run.info.status == "FINISHED" or report.get("result") == "failed":
            return run.info.run_id, report, dict(run.data.tags)
    return None


def evaluate_gates(state, version: str) -> list[GateResult]:
    """Every gate for `version` against the state's current champion, re-derived from attested evidence by the
    rules every verifier replays (`registry.derive`), with overrides applied. `attestations(results)` gives the
    envelopes an approval or a promotion copies into its entry."""
    vs = state.versions.get(str(version))
    if vs is None:
        raise MLOpsError(f"version {version} of '{state.model}' was not registered through the registry. "
                         f"Fix: register it with `mlops registry register --run <run_id> --name {state.model}`.")
    from registry.derive import required_gates

    found = attested_evidence(state, vs)
    gates = tuple(g for g in GATES if g in required_gates(state.policy))
    results = _derived(state, vs, found, gates)
    for i, result in enumerate(results):
        if result.gate == "spot_check":  # the stored verdicts must still be the ledgered ones; its words, if not
            judged = policy_gates(state, vs)[0]
            results[i] = judged if not judged.passed or result.passed else result
    for result in results:
        result.envelope = found.get(_kind(result.gate), (None, None))[1]
        overrides = [o for o in vs.overrides if o.get("gate") in (result.gate, "all")]
        if overrides and not result.passed:
            result.overridden_by = overrides[-1]
    return results


def _kind(gate: str) -> str:
    from registry.derive import GATE_KINDS

    return GATE_KINDS.get(gate, "")


def attestations(results: list[GateResult]) -> dict[str, dict]:
    """kind -> envelope of every attestation the gate results stood on (what an approval's entry names)."""
    return {_kind(r.gate): r.envelope for r in results if getattr(r, "envelope", None) is not None}


def failing(results: list[GateResult]) -> list[GateResult]:
    return [r for r in results if not r.ok]


# --------------------------------------------------------------------------- evidence bound by digest

# Which stored report each gate stood on: (the evidence key naming its run, the artifact path).
REPORTS = {"eval": ("gate_run", "gate/gate_report.json"), "contamination": ("eval_run", "eval/contamination.json"),
           "shadow": ("shadow_run", "shadow/shadow_report.json")}


def evidence_digests(results: list[GateResult]) -> dict[str, dict]:
    """The sha256 of every stored report the gates stood on, as an approval records them: a report changed,
    replaced or forged after the approval no longer matches (`changed_evidence`)."""
    from mlops.run_store import load_run_json
    from registry.entries import digest_of

    out = {}
    for r in results:
        if r.gate not in REPORTS or not r.evidence.get(REPORTS[r.gate][0]):
            continue
        key, path = REPORTS[r.gate]
        run_id = r.evidence[key]
        try:
            out[r.gate] = {"run": run_id, "path": path, "sha256": digest_of(load_run_json(run_id, path))}
        except NotFoundError:
            out[r.gate] = {"run": run_id, "path": path, "sha256": None}
    spot = next((r for r in results if r.gate == "spot_check" and r.evidence.get("review_seq")), None)
    if spot is not None:  # the verdicts are ledgered by digest in that review entry, which the approval names
        out["spot_check"] = {"check_id": spot.evidence.get("check_id"), "review_seq": spot.evidence["review_seq"]}
    return out


def changed_evidence(recorded: dict[str, dict]) -> list[str]:
    """Reports whose bytes are no longer what the approval recorded (or whose run is no longer FINISHED)."""
    from mlops.run_store import get_run, load_run_json
    from registry.entries import digest_of

    changed = []
    for gate, item in sorted(recorded.items()):
        if "run" not in item:
            continue
        try:
            status = get_run(item["run"]).info.status
            now = digest_of(load_run_json(item["run"], item["path"])) if status == "FINISHED" else None
        except NotFoundError:
            now = None
        if now != item.get("sha256"):
            changed.append(f"the {gate} report {item['path']} of run {item['run']} is not the one approved")
    return changed


# --------------------------------------------------------------------------- gates the release policy turns on


def policy_gates(state, version_state, policy=None) -> list[GateResult]:
    """The spot-check gate (the stored verdicts checked against the ledgered review) when the policy needs it."""
    from registry.config import policy_of

    policy = policy or policy_of(state.policy)  # the policy the verified ledger records, read with the state
    return [spot_check_gate(state, version_state, policy.spot_check)] if policy.spot_check.required else []


def spot_check_gate(state, version_state, policy) -> GateResult:
    from registry.spotcheck import judge

    passed, detail, evidence = judge(state, version_state.version, policy)
    return GateResult("spot_check", passed, detail, evidence)


def newest_shadow_report(model: str, version: str) -> tuple[str, dict] | None:
    """(run id, report) of the newest stored shadow report of a version (`mlops shadow report` stores it)."""
    from mlops.run_store import find_runs, load_run_json

    ref = f"models:/{model}/{version}"
    for run in find_runs({Tag.STAGE: "shadow", Tag.MODEL_REF: ref}, status="FINISHED", max_results=5):
        try:
            return run.info.run_id, load_run_json(run.info.run_id, "shadow/shadow_report.json")
        except NotFoundError:
            continue
    return None
