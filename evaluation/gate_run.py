"""`mlops gate`: find the exact eval evidence of challenger, champion and past champions, compare, report, tag.

Evidence is exact: an eval counts for a model only if it judged that content id under the model's own deployment
profile (never a forced one), on the suite versions the gate is configured with, and on the full suites (or the
`eval.limit` the gate's config declares). The eval recorded on a version (`mlops.eval_run_id`) is tried first,
then the newest qualifying one. Nothing here downloads weights: models are described from their tags.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.gate import GateReport, compare
from evaluation.report import to_markdown, write_report
from mlops.errors import MLOpsError, NotFoundError
from mlops.lineage import Tag


class EvidenceError(NotFoundError):
    """No stored eval satisfies the gate's evidence rules for a model."""


@dataclass(frozen=True)
class EvidenceRule:
    """What an eval run must match to count as evidence."""

    suites: tuple[str, ...]  # suite labels, e.g. ("business@v2", "general@v1")
    limit: int | None  # None: every item of every task

    @property
    def limit_tag(self) -> str:
        return limit_tag(self.limit)


def limit_tag(limit: int | None) -> str:
    return "all" if limit is None else str(int(limit))


@dataclass(frozen=True)
class Evidence:
    ref: str
    key: str
    eval_run_id: str
    summary: dict = field(repr=False)


@dataclass(frozen=True)
class GateOutcome:
    report: GateReport
    json_path: Path
    markdown_path: Path
    run_id: str


def expected_profile_hash(model) -> str:
    """The profile the model is released with: the version's (or run's) tag, or the folder's own file."""
    recorded = model.profile_hash
    if recorded:
        return recorded
    from mlops.model_refs import materialize

    return materialize(model).profile().profile_hash()


def disqualification(run, key: str, profile_hash: str, rule: EvidenceRule) -> str | None:
    """Why an eval run is not evidence for this model under this rule, or None when it is."""
    tags, params = run.data.tags, run.data.params
    if run.info.status != "FINISHED":
        return f"it is {run.info.status}, not FINISHED"
    if tags.get(Tag.STAGE) != "eval":
        return "it is not an eval run"
    if tags.get(Tag.MODEL_KEY) != key:
        return f"it judged model content {tags.get(Tag.MODEL_KEY)}, not {key}"
    if tags.get(Tag.EVAL_FORCED_PROFILE) == "true":
        return "it ran under a forced deployment profile, which can never satisfy a gate"
    if tags.get(Tag.PROFILE_HASH) != profile_hash:
        return f"its deployment profile {tags.get(Tag.PROFILE_HASH)} is not the model's {profile_hash}"
    ran = tuple(sorted(filter(None, tags.get(Tag.SUITE_VERSION, "").split(","))))
    if ran != tuple(sorted(rule.suites)):
        return f"it ran suites {','.join(ran) or 'none'}, the gate needs {','.join(sorted(rule.suites))}"
    limit = tags.get(Tag.EVAL_LIMIT) or limit_tag(None if params.get("limit") in (None, "None") else
                                                  int(params["limit"]))
    if limit != rule.limit_tag:
        return f"it ran with eval.limit={limit}, the gate needs eval.limit={rule.limit_tag}"
    return None


def find_evidence(model, rule: EvidenceRule, *, reference_hash: str | None = None) -> Evidence:
    """The eval run that counts for `model` (a description or resolved model) under `rule`; with
    `reference_hash`, its reference-form eval (that profile hash, recorded as the version's reference run)."""
    from mlops.model_refs import model_key
    from mlops.run_store import find_runs, get_run, load_run_json

    key = model_key(model)
    profile_hash = reference_hash or expected_profile_hash(model)
    recorded_tag = Tag.EVAL_REFERENCE_RUN if reference_hash else Tag.EVAL_RUN
    recorded = model.version_tags.get(recorded_tag) if model.kind == "version" else None
    candidates, rejected = [], []
    if recorded:
        try:
            candidates.append(get_run(recorded))
        except NotFoundError:
            rejected.append(f"recorded eval run {recorded}: it no longer exists")
    candidates += [r for r in find_runs({Tag.MODEL_KEY: key, Tag.STAGE: "eval"}, status=None, max_results=50)
                   if r.info.run_id != recorded]
    for run in candidates:
        why = disqualification(run, key, profile_hash, rule)
        if why is None:
            return Evidence(model.ref, key, run.info.run_id, load_run_json(run.info.run_id, "eval/summary.json"))
        rejected.append(f"eval run {run.info.run_id}: {why}")
    seen = "; ".join(rejected[:6]) if rejected else "there is no eval run of this content at all"
    limit = "" if rule.limit is None else f" eval.limit={rule.limit}"
    what = "reference-form eval (hf, as trained) for the quantization gate" if reference_hash else "eval"
    raise EvidenceError(
        f"model '{model.ref}' (content {key}, profile {profile_hash}) has no {what} the gate can use ({seen}). "
        f"Fix: run `mlops eval --model {model.ref}{' --reference' if reference_hash else ''} --suites "
        f"{','.join(s.split('@')[0] for s in rule.suites)}{limit}` without --profile/--force-profile, with the "
        "same config as the gate."
    )


def release_reference(model, evidence: Evidence, rule: EvidenceRule) -> tuple[str, Evidence] | None:
    """(release form, the same version's as-trained evidence) when the evidence judged a quantized form."""
    import yaml

    from mlops.profile import DeploymentProfile
    from mlops.run_store import get_run, load_run_text

    if not get_run(evidence.eval_run_id).data.tags.get(Tag.EVAL_ENGINE):
        return None  # an eval from before engines were recorded: hf, as trained
    profile = DeploymentProfile.model_validate(yaml.safe_load(load_run_text(evidence.eval_run_id,
                                                                            "eval/deployment_profile.yaml")))
    if profile.as_reference() == profile:  # the release form is the reference form
        return None
    reference = profile.as_reference()
    return profile.deployment_form(), find_evidence(model, rule, reference_hash=reference.profile_hash())


def _champion(ref: str | None):
    """The described champion, or None when the ref names an alias nobody holds yet (a first release)."""
    from mlops.model_refs import MODELS_RE, describe

    if not ref or not ref.strip():
        return None
    try:
        return describe(ref)
    except NotFoundError:
        match = MODELS_RE.match(ref.strip())
        if match and match["alias"]:
            return None
        raise


def evidence_rule(cfg) -> EvidenceRule:
    from evaluation.suites import get_suites

    eval_cfg = cfg.eval
    suites = get_suites(eval_cfg.suites, eval_cfg.suite_paths)
    return EvidenceRule(tuple(sorted({s.label for s in suites})), eval_cfg.limit)


def run_gate(cfg, challenger_ref: str, champion_ref: str | None, *, history: list[str] | None = None) -> GateOutcome:
    from mlops.config import require_section
    from mlops.lineage import collect_lineage
    from mlops.model_refs import describe, model_key, previous_versions, set_version_tags
    from mlops.paths import mlops_dir
    from mlops.tracking import tracked_run

    gate_cfg = require_section(cfg, "eval").gate
    rule = evidence_rule(cfg)
    challenger = describe(challenger_ref)
    champion = _champion(champion_ref)
    key = model_key(challenger)
    if champion is not None and model_key(champion) == key:
        raise MLOpsError(
            f"the challenger '{challenger_ref}' is the champion '{champion_ref}' itself (content {key}). "
            "Fix: gate a new model version against the current champion."
        )
    past = list(dict.fromkeys([*gate_cfg.history, *(history or [])]))
    if champion is not None:
        past += previous_versions(champion, Tag.GATE_EVAL, "passed", gate_cfg.history_from_registry)
    excluded = {key, model_key(champion) if champion else None}
    past_models = [m for m in (describe(r) for r in dict.fromkeys(past)) if model_key(m) not in excluded]
    mine = find_evidence(challenger, rule)
    # An eval that stopped at its contamination report is judged on that alone: no reference form, no champion.
    scored = not mine.summary.get("not_scored")
    as_trained = release_reference(challenger, mine, rule) if scored else None
    theirs = find_evidence(champion, rule) if champion and scored else None
    past_evidence = [find_evidence(m, rule) for m in past_models] if scored else []
    report = compare(mine.summary, theirs.summary if theirs else None, gate_cfg, challenger_label=challenger_ref,
                     champion_label=champion_ref if champion else "none",
                     history=[(e.ref, e.summary) for e in past_evidence],
                     reference=(as_trained[0], as_trained[1].summary) if as_trained else None)
    report.settings["evidence"] = evidence_record(challenger, champion, mine, theirs, past_evidence, rule)
    if as_trained:
        report.settings["evidence"]["reference"] = {"form": "hf (as trained)", "release_form": as_trained[0],
                                                    "eval_run_id": as_trained[1].eval_run_id}
    if champion is None and champion_ref:
        report.notes.insert(0, f"'{champion_ref}' names no model version yet")
    folder = mlops_dir() / "gates" / f"{key}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6}"
    json_path, md_path = write_report(report, folder)
    result = "passed" if report.passed else "failed"
    lineage = collect_lineage("gate", cfg.run.seed, extra={
        Tag.STAGE: "gate", Tag.MODEL_REF: challenger_ref, Tag.MODEL_KEY: key, Tag.GATE_EVAL: result,
        Tag.EVAL_RUN: mine.eval_run_id,
    })
    with tracked_run(cfg.run.experiment, run_name=f"gate {challenger.served_name}", tags=lineage.as_tags()) as run:
        run.log_artifact(json_path, "gate")
        run.log_artifact(md_path, "gate")
        run.log_metrics({"gate_passed": float(report.passed), "gate_checks": len(report.checks),
                         "gate_failures": len(report.reasons)}, step=0)
        run.log_params({"challenger": challenger_ref, "champion": champion_ref or "",
                        "history": ",".join(m.ref for m in past_models),
                        "challenger_eval_run": mine.eval_run_id,
                        "champion_eval_run": theirs.eval_run_id if theirs else ""})
        set_version_tags(challenger, {
            Tag.GATE_EVAL: result, Tag.GATE_REASONS: "; ".join(report.reasons)[:4000] or "all checks passed",
            Tag.GATE_RUN: run.run_id,
        })
    attest_gate(challenger, json_path, run.run_id, mine.eval_run_id)
    return GateOutcome(report, json_path, md_path, run.run_id)


def attest_gate(challenger, json_path: Path, gate_run: str, eval_run: str) -> str | None:
    """Whoever ran the gate signs its verdict about the challenger's registered files: the registry's eval gate
    counts only a report that an identity the release policy names for gates attested."""
    import json

    from registry.attest_store import attest_version
    from registry.entries import digest_of

    report = json.loads(json_path.read_text())
    champion = (report.get("settings") or {}).get("evidence", {}).get("champion") or {}
    predicate = {"gate_run": gate_run, "eval_run": eval_run, "result": report.get("result"),
                 "reasons": list(report.get("reasons") or [])[:50],
                 "champion": {"ref": champion.get("ref"), "content_id": champion.get("content_id")},
                 "report_sha256": digest_of(report)}
    materials = {"challenger-eval": eval_run, **({"champion-eval": champion["eval_run_id"]}
                                                 if champion.get("eval_run_id") else {})}
    return attest_version("gate", challenger.name, challenger.version, predicate, materials=materials)


def evidence_record(challenger, champion, mine: Evidence, theirs: Evidence | None, past: list[Evidence],
                    rule: EvidenceRule) -> dict:
    """Exactly what the verdict stands on, stored in the report (the registry checks it is still current)."""
    from mlops.model_refs import model_key

    def who(model, ev: Evidence | None) -> dict | None:
        if model is None:
            return None  # a champion's eval may be unread (an unscored challenger): it was still the champion
        return {"ref": model.ref, "name": model.name, "version": model.version,
                "content_id": ev.key if ev else model_key(model), "eval_run_id": ev.eval_run_id if ev else None}

    return {"challenger": who(challenger, mine), "champion": who(champion, theirs),
            "history": [{"ref": e.ref, "content_id": e.key, "eval_run_id": e.eval_run_id} for e in past],
            "suites": list(rule.suites), "limit": rule.limit_tag}


def render(outcome: GateOutcome) -> str:
    return to_markdown(outcome.report) + f"\nreport: {outcome.json_path}\n        {outcome.markdown_path}\n"
