"""`mlops loop check MODEL`: the thin wrapper of `evaluation.loop`, the decision logged as an MLflow run.

Exit status for cron: 0 checked (a round opened or not: the output and the run say which), 2 bad input (an
unknown model, a broken ledger, a missing config), 4 a round is due but the increment holds no accepted record
to build from (someone has to harvest and review).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mlops.cli_options import ConfigOpt, OverridesArg, load

app = typer.Typer(help="The next round, opened by the data: `loop check` builds the next snapshot (and, when the "
                       "recorded policy says so, launches its training) once the reviewed increment, a monitor "
                       "alert or the production version's age calls for it. It never promotes.",
                  no_args_is_help=True)


def run_check(model: str, increment: Path, *, config, train_config: str | None, experiment: str,
              monitor_days: int | None = None, build=None, launch=None, monitor=None, run=None) -> dict:
    """gather -> decide -> build/launch, inside one tracked run that records the decision and its inputs (`run`:
    a context manager yielding a tracker, for tests; default an MLflow run through mlops.tracking)."""
    from evaluation.loop import (
        check,
        finite,
        gather,
        mlflow_project_launcher,
        require_train_config,
        snapshot_builder,
    )
    from mlops.lineage import Tag
    from mlops.paths import project_home
    from mlops.tracking import tracked_run
    from registry.resolve import release_policy

    policy = release_policy()
    require_train_config(policy.loop, train_config)
    days = monitor_days or policy.monitor.baseline_days + 2 * policy.monitor.recent_days
    run = run or tracked_run(experiment, run_name=f"loop-check-{model}", tags={Tag.STAGE: "loop"},
                             attach_env_run=False)
    with run as tracker:
        inputs = gather(model, increment, policy=policy.loop, monitor_days=days, monitor=monitor)
        build = build or snapshot_builder(config, ratio=policy.loop.history_ratio)
        launch = launch or (mlflow_project_launcher(train_config, project=project_home() / "mlproject",
                                                    experiment=experiment) if train_config else None)
        result = check(model, increment, policy=policy.loop, inputs=inputs, build=build, launch=launch)
        tracker.log_params({"model": model, "increment": str(increment), "decision": result["decision"],
                            "reasons": "; ".join(result["reasons"]) or "none",
                            **{f"policy.{k}": v for k, v in policy.loop.model_dump(mode="json").items()}})
        tracker.log_metrics({"accepted_records": inputs.accepted, "pending_rows": inputs.pending,
                             "accepted_pairs": inputs.pairs, "pending_pairs": inputs.pairs_pending,
                             "production_age_days": finite(inputs.age_days), "monitor_alerts": len(inputs.alerts)})
        snapshot = result["snapshot"] or {}
        tracker.set_tags({"mlops.loop.decision": result["decision"], "mlops.loop.objective": result["objective"],
                          Tag.SNAPSHOT_ID: snapshot.get("snapshot_id"),
                          Tag.DATA_RUN: snapshot.get("data_run_id")})
        tracker.log_dict(result, "loop_decision.json")
        result["run_id"] = tracker.run_id
    return result


@app.command("check")
def check_command(
    model: str = typer.Argument(..., help="registered model name"),
    increment: Path = typer.Option(..., "--increment", help="folder of the harvested, reviewed increment "
                                   "(`mlops data harvest --out`)"),
    config: Path = ConfigOpt,
    train_config: str | None = typer.Option(None, "--train-config", help="training config the launched run uses "
                                            "(needed when the policy launches training)"),
    experiment: str = typer.Option("loop", help="experiment of the decision's run"),
    as_json: bool = typer.Option(False, "--json"),
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Open the next round when the recorded policy (registry.loop) says so: build the next snapshot from the
    reviewed increment, mixed with and deduplicated against the production version's snapshot; launch its training
    when the policy says so. Exit 0 checked, 2 bad input, 4 due but nothing accepted to build from."""
    from evaluation.loop import EXIT_NOTHING_TO_BUILD
    from mlops.errors import MLOpsError

    if config is None:
        raise MLOpsError("`mlops loop check` needs --config: the data config the next snapshot is built with. Fix: "
                         "e.g. --config configs/data/sample.yaml.")
    result = run_check(model, increment, config=load(config, overrides), train_config=train_config,
                       experiment=experiment)
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        typer.echo(summary(result))
    if result["decision"] == "due":
        raise typer.Exit(EXIT_NOTHING_TO_BUILD)


def summary(result: dict) -> str:
    from mlops.text import shown

    inputs = result["inputs"]
    age = "none in production" if inputs["age_days"] is None else f"v{inputs['production']}, {inputs['age_days']:.1f} days"
    lines = [f"{shown(result['model'])}: {result['decision']} (run {result['run_id']})",
             f"  inputs: {inputs['accepted']} accepted records ({inputs['pending']} pending review), production "
             f"{age}, {len(inputs['alerts'])} monitor alert(s)"]
    lines += [f"  reason: {shown(r)}" for r in result["reasons"]]
    lines += [f"  note: {shown(n)}" for n in inputs["notes"] + result.get("notes", [])]
    if result["snapshot"]:
        s = result["snapshot"]
        lines.append(f"  snapshot {s['snapshot_id']} ({s['records']} accepted records, history {s['history']}), data "
                     f"run {s['data_run_id']}")
    if result["training"]:
        t = result["training"]
        lines.append(f"  training: launched, run {t['run_id']}" if t.get("launched") else
                     f"  training: not launched ({shown(t.get('why'))})")
    lines.append("  nothing is promoted: a trained round goes through eval, gates and approval")
    return "\n".join(lines)
