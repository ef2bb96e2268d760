"""`mlops sweep ...`: run a sweep, join one as a worker, show the best trial, inspect and list studies."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mlops.cli_options import ConfigOpt, OverridesArg, split_overrides
from mlops.errors import ConfigError

app = typer.Typer(
    help="Optuna sweeps over training: pruning, nested lineage-tagged trial runs, shared PostgreSQL studies.",
    no_args_is_help=True,
)
StorageOpt = typer.Option(
    None, "--storage", help="study storage URL, e.g. postgresql://user@host:5432/db (default: SQLite under .mlops, "
    "or $MLOPS_SWEEP_STORAGE)"
)
StudyOpt = typer.Option(..., "--study", help="study name")


def _count(value: str | None, name: str) -> int | None:
    """MLflow passes float parameters as '8.0'."""
    if value is None or not str(value).strip():
        return None
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"--{name} '{value}' is not a number. Fix: pass a whole number such as --{name} 8.") from None
    if number != int(number) or number < 1:
        raise ConfigError(f"--{name} {value} is not a whole number >= 1. Fix: pass e.g. --{name} 8.")
    return int(number)


@app.command("run")
def run(
    config: Path | None = ConfigOpt,
    n_trials: str | None = typer.Option(None, "--n-trials", help="trials to add to the study (default sweep.n_trials)"),
    study: str | None = typer.Option(None, "--study", help="study name (default sweep.study)"),
    storage: str | None = StorageOpt,
    register: bool = typer.Option(False, "--register", help="register the best trial's model as a candidate"),
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Start (or resume) a study: checks everything, smoke-trains the base config once, runs the trials, and
    logs best params, trial table and plots to the parent run. `sweep.*` overrides configure the sweep; any
    other override (train.max_steps=20) changes the base config of every trial."""
    from training.sweep.objective import release_world
    from training.sweep.session import run_sweep

    try:
        summary = run_sweep(config, split_overrides(overrides), study=study, n_trials=_count(n_trials, "n-trials"),
                            storage=storage, register=True if register else None, log=typer.echo)
    finally:
        release_world()
    states: dict[str, int] = {}
    for o in summary.outcomes:
        states[o.state] = states.get(o.state, 0) + 1
    typer.echo(f"study {summary.study}: this process ran {len(summary.outcomes)} trial(s) {states}; parent run "
               f"{summary.parent_run_id}")
    if summary.best:
        b = summary.best
        typer.echo(f"best: trial {b['number']} value={b['value']:.6g} params={b['params']} run={b['mlflow_run_id']}")
    if summary.registered:
        typer.echo(f"registered: {summary.registered}")


@app.command("worker")
def worker(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    wait: float = typer.Option(0.0, "--wait", min=0, help="seconds to wait for the study and its queued trials"),
    max_trials: int | None = typer.Option(None, "--max-trials", min=1, help="stop after this many trials"),
) -> None:
    """Join a study started by `mlops sweep run` (on this or another machine) and run its queued trials."""
    from training.sweep.objective import release_world
    from training.sweep.session import run_worker

    try:
        summary = run_worker(study, storage, wait_s=wait, max_trials=max_trials, log=typer.echo)
    finally:
        release_world()
    typer.echo(f"worker on study {study}: ran {len(summary.outcomes)} trial(s): "
               f"{[f'{o.number}:{o.state}' for o in summary.outcomes]}")


@app.command("best")
def best(
    study: str = StudyOpt,
    storage: str | None = StorageOpt,
    register: bool = typer.Option(False, "--register", help="register the best trial's model as a candidate"),
    name: str | None = typer.Option(None, "--name", help="registered model name (default: the study name)"),
    alias: str | None = typer.Option(None, "--alias", hidden=True,
                                     help="no longer moves anything: a release alias is a governed act"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Print the best trial with its MLflow run (and register its model with --register: a registry act as
    MLOPS_USER, ledgered, stage candidate; releasing it is `mlops registry request/approve/promote`)."""
    from mlops.errors import MLOpsError
    from training.sweep import runner
    from training.sweep import storage as st
    from training.sweep.results import best_summary, register_best
    from training.sweep.session import registering_identity

    if alias not in (None, "", "candidate"):
        raise MLOpsError(f"--alias {alias}: a sweep registers its best trial as a candidate and moves no alias; "
                         f"@{alias} is given only by the registry's release acts. Fix: drop --alias, then `mlops "
                         "registry request <model> <version> --to production --comment ...`, an approval and "
                         "`mlops registry promote`.")
    url = st.resolve_url(storage)
    st.check_reachable(url)
    found = runner.load_study(runner.open_study_storage(url), study)
    summary = best_summary(found, runner.study_info(found)["parent_run_id"])
    if register:
        summary = register_best(found, registering_identity(), name=name or study)
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
        return
    typer.echo(f"study:      {summary['study']} ({summary['counts']})")
    typer.echo(f"best trial: {summary['number']}  value={summary['value']:.6g}")
    typer.echo(f"params:     {json.dumps(summary['params'])}")
    typer.echo(f"run:        {summary['mlflow_run_id']} (parent {summary['parent_run_id']})")
    typer.echo(f"model:      {summary['model_uri']}")
    if register:
        typer.echo(f"registered: models:/{summary['registered_model']}/{summary['version']} (stage candidate)")


@app.command("status")
def status(study: str = StudyOpt, storage: str | None = StorageOpt,
           as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Trials of a study with state, value, MLflow run and failure reason (fails trials of dead workers)."""
    from training.sweep.session import study_status

    info = study_status(study, storage)
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    typer.echo(f"study {info['study']} on {info['storage']}: {info['counts']} parent run {info['parent_run_id']}")
    for row in info["trials"]:
        value = "" if row["value"] is None else f"{row['value']:.5g}"
        why = row.get("fail_reason") or ""
        typer.echo(f"  {row['number']:>4} {row['state']:<8} {value:>10} {row['mlflow_run_id'] or '-'} {why[:120]}")


@app.command("list")
def list_studies(storage: str | None = StorageOpt) -> None:
    """Studies in the storage."""
    from training.sweep import runner
    from training.sweep import storage as st

    url = st.resolve_url(storage)
    st.check_reachable(url)
    names = st.study_names(runner.open_study_storage(url))
    typer.echo("\n".join(names) if names else f"no studies in {st.display_url(url)}")


@app.command("spaces")
def spaces() -> None:
    """Registered search spaces (with their parameters), pruners and samplers."""
    from training.sweep.pruners import PRUNERS, SAMPLERS
    from training.sweep.spaces import SPACES

    for name in SPACES.names():
        typer.echo(f"space {name}:")
        for param, spec in SPACES.get(name).items():
            shape = f"choices={spec.choices}" if spec.type == "categorical" else \
                f"[{spec.low:g}, {spec.high:g}]{' log' if spec.log else ''}"
            typer.echo(f"  {param:18} {spec.key}{f' (fraction of {spec.of})' if spec.of else ''}: {spec.type} {shape}")
    typer.echo(f"pruners: {', '.join(PRUNERS.names())}\nsamplers: {', '.join(SAMPLERS.names())}")


@app.command("dashboard")
def dashboard(
    storage: str | None = StorageOpt,
    host: str = typer.Option("127.0.0.1", help="address optuna-dashboard listens on"),
    port: int = typer.Option(8080, help="port optuna-dashboard listens on"),
    print_url: bool = typer.Option(False, "--print-url", help="only print the storage URL for optuna-dashboard"),
) -> None:
    """Open optuna-dashboard (`pip install optuna-dashboard`) on the same storage the sweeps use."""
    import os
    import shutil
    import sys

    from training.sweep import storage as st

    url = st.resolve_url(storage)  # with the driver named: optuna-dashboard opens it through SQLAlchemy
    exe = shutil.which("optuna-dashboard") or str(Path(sys.executable).with_name("optuna-dashboard"))
    if print_url or not Path(exe).exists():
        typer.echo(url)
        if not print_url:
            typer.echo("optuna-dashboard is not installed: `pip install optuna-dashboard` (it keeps torch as is), "
                       f"then `optuna-dashboard {url}`", err=True)
        return
    st.check_reachable(url)
    typer.echo(f"optuna-dashboard on http://{host}:{port} for {st.display_url(url)}")
    os.execv(exe, [exe, url, "--host", host, "--port", str(port)])
