"""Layer 4 (acts' evidence): release gates, each decided from stored evidence, never from a tag a hand can edit.

- lineage:       the registration entry in the ledger recorded every required lineage tag.
- data:          the snapshot manifest logged by the data run: no failing batch was admitted.
- eval:          the newest stored gate report for this content passed, against the champion current *now*
                 (a report against an earlier champion is stale and must be re-run).
- contamination: the contamination report of the eval the gate stood on is clean.
- spot_check:    (when the release policy requires it) the newest ledgered human review of the version passed,
                 against the champion current now, by someone other than its trainer (registry.spotcheck).
- shadow:        (when the release policy requires it) the candidate answered at least the configured number of
                 shadowed live requests, with few enough errors.
A failing gate names itself and its evidence. An admin override (ledgered, shown forever) lets it pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlops.errors import MLOpsError, NotFoundError
from mlops.lineage import Tag

GATES = ("lineage", "data", "eval", "contamination", "spot_check", "shadow")
REQUIRED_LINEAGE = (Tag.CONFIG_HASH, Tag.SNAPSHOT_ID, Tag.DATA_RUN, Tag.IMAGE_TAG, Tag.GIT_COMMIT, Tag.CODE_VERSION,
                    Tag.BASE_MODEL_ID, Tag.SEED, Tag.CHECKPOINT_MANIFEST, Tag.MODEL_ID, Tag.PROFILE_HASH)


@dataclass
class GateResult:
    gate: str
    passed: bool
    detail: str
    evidence: dict = field(default_factory=dict)
    overridden_by: dict | None = None

    @property
    def ok(self) -> bool:
        return self.passed or self.overridden_by is not None

    def as_dict(self) -> dict:
        return {"gate": self.gate, "passed": self.passed, "ok": self.ok, "detail": self.detail,
                "evidence": self.evidence, "overridden_by": self.overridden_by}


def missing_lineage(tags: dict[str, str]) -> list[str]:
    return [str(t) for t in REQUIRED_LINEAGE if not str(tags.get(t, "")).strip()]


def lineage_gate(version_state) -> GateResult:
    missing = missing_lineage(version_state.evidence.get("lineage", {}))
    if missing:
        return GateResult("lineage", False, f"lineage incomplete at registration: missing {', '.join(missing)}")
    return GateResult("lineage", True, "every required lineage tag was recorded at registration",
                      {"run_id": version_state.evidence.get("run_id")})


def data_gate(version_state) -> GateResult:
    from mlops.run_store import load_run_json

    data_run = version_state.evidence.get("lineage", {}).get(Tag.DATA_RUN)
    snapshot = version_state.evidence.get("lineage", {}).get(Tag.SNAPSHOT_ID)
    if not data_run:
        return GateResult("data", False, f"no data run is recorded for snapshot {snapshot}: its GE results cannot "
                                         "be read")
    try:
        manifest = load_run_json(data_run, "snapshot/manifest.json")
    except NotFoundError as err:
        return GateResult("data", False, f"the data run's manifest cannot be read: {err}", {"data_run": data_run})
    batches = manifest.get("batches", [])
    admitted_failures = [b["batch"] for b in batches if b.get("status") == "passed" and b.get("failed")]
    unknown = [b["batch"] for b in batches if b.get("status") not in ("passed", "quarantined")]
    evidence = {"data_run": data_run, "snapshot_id": manifest.get("snapshot_id"),
                "batches": len(batches), "quarantined": sum(b.get("status") == "quarantined" for b in batches)}
    if manifest.get("snapshot_id") != snapshot:
        return GateResult("data", False, f"the data run built {manifest.get('snapshot_id')}, not {snapshot}", evidence)
    if admitted_failures or unknown:
        return GateResult("data", False, f"batches admitted without passing the GE gate: "
                                         f"{admitted_failures + unknown}", evidence)
    if not any(b.get("status") == "passed" for b in batches):
        return GateResult("data", False, "no batch passed the GE gate", evidence)
    return GateResult("data", True, f"{evidence['batches']} batches gated by GE, {evidence['quarantined']} "
                                    "quarantined, none failing admitted", evidence)


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


def eval_gate(version_state, champion_state) -> GateResult:
    found = _newest_gate_run(version_state.content_id or "")
    if found is None:
        return GateResult("eval", False, "no stored gate report for this model. Run `mlops gate --challenger "
                                         "models:/<model>/<version> --champion models:/<model>@production`")
    run_id, report, tags = found
    recorded = ((report.get("settings") or {}).get("evidence") or {}).get("champion") or {}
    champion_now = champion_state.content_id if champion_state else None
    evidence = {"gate_run": run_id, "eval_run": tags.get(Tag.EVAL_RUN), "result": report.get("result"),
                "champion_in_report": recorded.get("content_id"), "champion_now": champion_now}
    if recorded.get("content_id") != champion_now:
        now = f"v{champion_state.version}" if champion_state else "no champion"
        return GateResult("eval", False, f"the newest gate report (run {run_id}) compared against "
                                         f"{recorded.get('ref') or 'no champion'}, but the champion now is {now}: "
                                         "it is stale. Re-run the gate against the current champion", evidence)
    if report.get("result") != "passed":
        reasons = "; ".join(report.get("reasons") or [])[:600]
        return GateResult("eval", False, f"the gate report (run {run_id}) failed: {reasons}", evidence)
    return GateResult("eval", True, f"gate run {run_id} passed against {recorded.get('ref') or 'the floors'}",
                      evidence)


def contamination_gate(version_state, eval_result: GateResult) -> GateResult:
    from mlops.run_store import get_run, load_run_json

    gate_run = eval_result.evidence.get("gate_run")
    if not gate_run:
        return GateResult("contamination", False, "no gate run, so no eval whose contamination report to read")
    evidence = eval_result.evidence
    eval_run = evidence["eval_run"] if "eval_run" in evidence else get_run(gate_run).data.tags.get(Tag.EVAL_RUN)
    try:
        finished = eval_run and get_run(eval_run).info.status == "FINISHED"
        report = load_run_json(eval_run, "eval/contamination.json") if finished else None
    except NotFoundError:
        report = None
    if report is None:
        return GateResult("contamination", False, f"eval run {eval_run} stored no contamination report",
                          {"eval_run": eval_run})
    offending = [i.get("id") for i in report.get("offending", [])]
    evidence = {"eval_run": eval_run, "status": report.get("status"), "offending": offending[:50]}
    if report.get("status") != "checked":
        return GateResult("contamination", False, f"contamination was not checked ({report.get('status')})", evidence)
    if offending:
        return GateResult("contamination", False, f"{len(offending)} eval items overlap the training snapshot: "
                                                  f"{', '.join(map(str, offending[:10]))}", evidence)
    return GateResult("contamination", True, "no eval item overlaps the training snapshot", evidence)


def evaluate_gates(state, version: str) -> list[GateResult]:
    """Every gate for `version` against the state's current champion, with overrides applied."""
    vs = state.versions.get(str(version))
    if vs is None:
        raise MLOpsError(f"version {version} of '{state.model}' was not registered through the registry. "
                         f"Fix: register it with `mlops registry register --run <run_id> --name {state.model}`.")
    from mlops.run_store import one_view

    champion = state.versions.get(state.aliases.get("production", ""))
    with one_view():
        results = [lineage_gate(vs), data_gate(vs)]
        eval_result = eval_gate(vs, champion if champion and champion.version != vs.version else None)
        results += [eval_result, contamination_gate(vs, eval_result)]
        results += policy_gates(state, vs)
    for result in results:
        overrides = [o for o in vs.overrides if o.get("gate") in (result.gate, "all")]
        if overrides and not result.passed:
            result.overridden_by = overrides[-1]
    return results


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
    """The spot-check and shadow gates, each only when `registry.<gate>.required` says so."""
    from registry.config import policy_of

    policy = policy or policy_of(state.policy)  # the policy the verified ledger records, read with the state
    out = []
    if policy.spot_check.required:
        out.append(spot_check_gate(state, version_state, policy.spot_check))
    if policy.shadow.required:
        out.append(shadow_gate(state.model, version_state, policy.shadow))
    return out


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


def shadow_gate(model: str, version_state, policy) -> GateResult:
    """Judged on the stored shadow report (the serving stage's own definition of an answer and an error)."""
    import json

    version = version_state.version
    found = newest_shadow_report(model, version)
    limits = {"min_requests": policy.min_requests, "max_error_rate": policy.max_error_rate}
    if found is None:
        return GateResult("shadow", False, f"no stored shadow report for version {version}. Fix: serve it with "
                                           f"`mlops serve --shadow models:/{model}/{version}`, then run `mlops shadow "
                                           f"report {model} {version}`", limits)
    run_id, report = found
    shadowed = int(report.get("shadowed") or 0)
    errors = int((report.get("errors") or {}).get("shadow") or 0)
    kept = {**json.loads(json.dumps(report, default=str)), "shadow_run": run_id, "shadow_errors": errors, **limits}
    rate = errors / shadowed if shadowed else 0.0
    if shadowed < policy.min_requests:
        return GateResult("shadow", False, f"the candidate answered {shadowed} shadowed requests (report run "
                                           f"{run_id}); the policy needs {policy.min_requests}. Fix: serve it with "
                                           f"`mlops serve --shadow models:/{model}/{version}` for longer, then run "
                                           f"`mlops shadow report {model} {version}`", kept)
    if rate > policy.max_error_rate:
        return GateResult("shadow", False, f"{errors} of {shadowed} shadow answers failed ({rate:.1%} > "
                                           f"{policy.max_error_rate:.1%}; report run {run_id})", kept)
    return GateResult("shadow", True, f"{shadowed} shadowed requests, {rate:.1%} errors (report run {run_id})", kept)
