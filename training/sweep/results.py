"""What a study found: the trial table, the best trial with its MLflow run, Optuna's plots, registration.

Everything is logged to the sweep's parent run through the tracker (artifacts open in the MLflow UI):
`sweep/trials.csv` and `sweep/trials.json` (the table), `sweep/best.json`, `plots/*.png`.
"""

from __future__ import annotations

import json
import math
import tempfile
import warnings
from pathlib import Path
from typing import Any

from mlops.errors import NotFoundError
from mlops.lineage import Tag
from training.sweep.trial import HASH_ATTR, MODEL_ATTR, REASON_ATTR, RUN_ATTR, STEP_ATTR, WORKER_ATTR

PLOTS = {
    "optimization_history": "plot_optimization_history",
    "param_importances": "plot_param_importances",
    "parallel_coordinate": "plot_parallel_coordinate",
    "intermediate_values": "plot_intermediate_values",
}


def trial_rows(study) -> list[dict[str, Any]]:
    """One row per trial: number, state, value, params, MLflow run, duration, last step, failure reason."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        duration = (t.datetime_complete - t.datetime_start).total_seconds() \
            if t.datetime_complete and t.datetime_start else None
        last_step = t.last_step if t.intermediate_values else None
        rows.append({
            "number": t.number, "state": t.state.name, "value": t.value,
            **{f"param.{k}": v for k, v in sorted(t.params.items())},
            "mlflow_run_id": t.user_attrs.get(RUN_ATTR), "duration_s": round(duration, 3) if duration else None,
            "last_step": last_step, "stopped_at_step": t.user_attrs.get(STEP_ATTR),
            "config_hash": t.user_attrs.get(HASH_ATTR), "model_uri": t.user_attrs.get(MODEL_ATTR),
            "worker": t.user_attrs.get(WORKER_ATTR),
            "fail_reason": t.user_attrs.get(REASON_ATTR),
        })
    return rows


def counts(study) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


def best_trial(study):
    """The best COMPLETE trial; NotFoundError when none completed."""
    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        raise NotFoundError(
            f"study '{study.study_name}' has no completed trial yet ({_counts_text(study)}). "
            "Fix: run more trials (`mlops sweep run` or `mlops sweep worker`), or widen the search space."
        )
    return study.best_trial


def best_summary(study, parent_run_id: str | None = None) -> dict[str, Any]:
    t = best_trial(study)
    run_id = t.user_attrs.get(RUN_ATTR)
    return {"study": study.study_name, "number": t.number, "value": t.value, "params": dict(t.params),
            "mlflow_run_id": run_id, "model_uri": t.user_attrs.get(MODEL_ATTR),
            "config_hash": t.user_attrs.get(HASH_ATTR), "parent_run_id": parent_run_id, "counts": counts(study)}


def _counts_text(study) -> str:
    return ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts(study).items())) or "no trials"


def _csv(rows: list[dict]) -> str:
    import csv
    import io

    columns = list(dict.fromkeys(k for row in rows for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def save_plots(study, folder: Path) -> tuple[list[Path], dict[str, str]]:
    """Optuna's matplotlib plots as PNG files; a plot the study cannot draw yet is skipped with the reason."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    import optuna.visualization.matplotlib as ovm

    written, skipped = [], {}
    for name, func in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = getattr(ovm, func)(study)
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
            fig.set_size_inches(9, 6)
            path = folder / f"{name}.png"
            fig.savefig(path, dpi=90, bbox_inches="tight")
            plt.close(fig)
            written.append(path)
        except (ValueError, RuntimeError, ZeroDivisionError, optuna.exceptions.OptunaError) as err:
            skipped[name] = f"{type(err).__name__}: {err}"
            plt.close("all")
    return written, skipped


def log_results(tracker, study, plan) -> dict[str, Any] | None:
    """Best params and value, the trial table and the plots, logged to the parent run."""
    rows = trial_rows(study)
    n = counts(study)
    with tempfile.TemporaryDirectory(prefix="mlops-sweep-") as tmp:
        folder = Path(tmp)
        (folder / "trials.csv").write_text(_csv(rows))
        tracker.log_artifact(folder / "trials.csv", "sweep")
        columns = list(dict.fromkeys(k for row in rows for k in row))
        tracker.log_dict({"columns": columns, "data": [[r.get(c) for c in columns] for r in rows]},
                         "sweep/trials.json")
        plots, skipped = save_plots(study, folder)
        for path in plots:
            tracker.log_artifact(path, "plots")
        if skipped:
            tracker.log_dict(skipped, "plots/skipped.json")
    tracker.log_metrics({f"trials_{state.lower()}": float(k) for state, k in n.items()})
    try:
        best = best_summary(study, getattr(tracker, "run_id", None))
    except NotFoundError:
        return None
    tracker.log_dict(best, "sweep/best.json")
    # Params are write-once in MLflow: each sweep session has its own parent run, so this is its best.
    tracker.log_params({f"best.{k}": v for k, v in best["params"].items()})
    if best["value"] is not None and math.isfinite(best["value"]):
        tracker.log_metrics({f"best_{plan.objective.metric.replace('/', '_')}": best["value"]})
    tracker.set_tags({Tag.SWEEP_BEST_TRIAL: best["number"], Tag.SWEEP_BEST_RUN: best["mlflow_run_id"]})
    return best


def register_best(study, actor, *, name: str) -> dict[str, Any]:
    """Register the best trial's model through the registry's one door: `actor` (an authenticated identity with
    the register role), lineage checked, ledgered, stage candidate, no alias moved."""
    from registry.release import register

    best = best_summary(study)
    if not best["mlflow_run_id"] or not best["model_uri"]:
        raise NotFoundError(
            f"the best trial {best['number']} of study '{study.study_name}' logged no model "
            f"(run {best['mlflow_run_id']}). Fix: keep train.final_model=true in the base config."
        )
    artifact = best["model_uri"].split("/", 3)[-1] if best["model_uri"].startswith("runs:/") else "model"
    tags = {Tag.SWEEP_STUDY: study.study_name, Tag.SWEEP_TRIAL: best["number"]}
    version = register(actor, best["mlflow_run_id"], name, artifact_path=artifact, tags=tags)
    return {**best, "registered_model": name, "version": version, "stage": "candidate"}


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)
