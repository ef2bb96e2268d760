"""`mlops gate`: find the eval runs of challenger, champion and past champions, compare, report, tag."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from evaluation.gate import GateReport, compare
from evaluation.report import to_markdown, write_report
from mlops.errors import MLOpsError, NotFoundError
from mlops.lineage import Tag


@dataclass(frozen=True)
class GateOutcome:
    report: GateReport
    json_path: Path
    markdown_path: Path
    run_id: str


def eval_summary(model) -> dict:
    """The summary of the newest finished deployment-form eval of a resolved model."""
    from registry.versions import latest_run, load_run_json

    run_id = latest_run({Tag.MODEL_KEY: model.key, Tag.STAGE: "eval"})
    if run_id is None:
        raise NotFoundError(
            f"model '{model.ref}' ({model.key}) has no finished eval run. "
            f"Fix: run `mlops eval --model {model.ref}` first."
        )
    return load_run_json(run_id, "eval/summary.json")


def _champion(ref: str | None):
    """The resolved champion, or None when the ref names an alias nobody holds yet (a first release)."""
    from registry.versions import MODELS_RE, resolve_model_ref

    if not ref or not ref.strip():
        return None
    try:
        return resolve_model_ref(ref)
    except NotFoundError:
        match = MODELS_RE.match(ref.strip())
        if match and match["alias"]:
            return None
        raise


def run_gate(cfg, challenger_ref: str, champion_ref: str | None, *, history: list[str] | None = None) -> GateOutcome:
    from mlops.config import require_section
    from mlops.lineage import collect_lineage
    from mlops.paths import mlops_dir
    from mlops.tracking import tracked_run
    from registry.versions import previous_versions, resolve_model_ref, set_version_tags

    gate_cfg = require_section(cfg, "eval").gate
    challenger = resolve_model_ref(challenger_ref)
    champion = _champion(champion_ref)
    if champion is not None and champion.key == challenger.key:
        raise MLOpsError(
            f"the challenger '{challenger_ref}' is the champion '{champion_ref}' itself. "
            "Fix: gate a new model version against the current champion."
        )
    past = list(dict.fromkeys([*gate_cfg.history, *(history or [])]))
    if champion is not None:
        past += previous_versions(champion, Tag.GATE_EVAL, "passed", gate_cfg.history_from_registry)
    past_models = [m for m in (resolve_model_ref(r) for r in dict.fromkeys(past))
                   if m.key not in {challenger.key, champion.key if champion else None}]
    mine = eval_summary(challenger)
    theirs = eval_summary(champion) if champion else None
    report = compare(mine, theirs, gate_cfg, challenger_label=challenger_ref,
                     champion_label=champion_ref if champion else "none",
                     history=[(m.ref, eval_summary(m)) for m in past_models])
    if champion is None and champion_ref:
        report.notes.insert(0, f"'{champion_ref}' names no model version yet")
    folder = mlops_dir() / "gates" / f"{challenger.key}-{time.strftime('%Y%m%d-%H%M%S')}"
    json_path, md_path = write_report(report, folder)
    result = "passed" if report.passed else "failed"
    lineage = collect_lineage("gate", cfg.run.seed, extra={
        Tag.STAGE: "gate", Tag.MODEL_REF: challenger_ref, Tag.MODEL_KEY: challenger.key, Tag.GATE_EVAL: result,
    })
    with tracked_run(cfg.run.experiment, run_name=f"gate {challenger.served_name}", tags=lineage.as_tags()) as run:
        run.log_artifact(json_path, "gate")
        run.log_artifact(md_path, "gate")
        run.log_metrics({"gate_passed": float(report.passed), "gate_checks": len(report.checks),
                         "gate_failures": len(report.reasons)}, step=0)
        run.log_params({"challenger": challenger_ref, "champion": champion_ref or "",
                        "history": ",".join(m.ref for m in past_models)})
        set_version_tags(challenger, {
            Tag.GATE_EVAL: result, Tag.GATE_REASONS: "; ".join(report.reasons)[:4000] or "all checks passed",
            Tag.GATE_RUN: run.run_id,
        })
        return GateOutcome(report, json_path, md_path, run.run_id)


def render(outcome: GateOutcome) -> str:
    return to_markdown(outcome.report) + f"\nreport: {outcome.json_path}\n        {outcome.markdown_path}\n"
