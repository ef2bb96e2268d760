"""`mlops`: one command per stage. Heavy packages are imported inside commands, so `--help` is instant."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from mlops.cli_options import ConfigOpt, OverridesArg, load
from mlops.errors import MLOpsError

app = typer.Typer(
    help="Registry-centric MLOps for fine-tuning LLMs: base models, data snapshots, training, eval, sweeps.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
base_model_app = typer.Typer(help="Import and list base models.", no_args_is_help=True)
config_app = typer.Typer(help="Show the resolved config and its hash.", no_args_is_help=True)
app.add_typer(base_model_app, name="base-model")
app.add_typer(config_app, name="config")
tracking_app = typer.Typer(help="Prepare and inspect the tracking store.", no_args_is_help=True)
app.add_typer(tracking_app, name="tracking")
# `mlops team`: the tracking server's per-team permissions (MLflow's basic-auth app); light to import.
from mlops.tenant_auth_cli import app as team_app  # noqa: E402

app.add_typer(team_app, name="team")


@base_model_app.command("import")
def base_model_import(name: str = typer.Argument(..., help="built-in base model: smollm2 or tiny")) -> None:
    """Import a built-in base model into the local catalog (a no-op when already imported)."""
    from mlops.base_models import catalog, import_base_model

    before = catalog().get(name)
    entry = import_base_model(name)
    state = "already imported" if before else f"imported in {entry['import_seconds']} s"
    typer.echo(f"{entry['name']}: {entry['id']} at {entry['path']} ({state})")


@base_model_app.command("list")
def base_model_list() -> None:
    """Show the base model catalog and the built-in models not imported yet."""
    from mlops.base_models import BASE_MODELS, catalog

    entries = catalog()
    for name in BASE_MODELS.names():
        entry = entries.get(name)
        if entry:
            typer.echo(f"{name:10} {entry['id']}  {entry['path']}  ({entry['description']})")
        else:
            typer.echo(f"{name:10} {'-':19}  not imported: mlops base-model import {name}")


@config_app.command("show")
def config_show(config: Path | None = ConfigOpt, overrides: list[str] | None = OverridesArg) -> None:
    """Print the resolved config (every default spelled out) and its canonical hash."""
    from mlops.config import config_hash, resolved_yaml

    cfg = load(config, overrides)
    typer.echo(resolved_yaml(cfg))
    typer.echo(f"# config hash: {config_hash(cfg)}")


@tracking_app.command("init")
def tracking_init(experiment: str = typer.Option("mlops", help="experiment to create if missing")) -> None:
    """Check the tracking store and create an experiment whose artifacts live under .mlops/ (embedded default).

    Run it before `mlflow run --experiment-name NAME`, which would otherwise put artifacts in ./mlruns.
    """
    from mlops.tracking import init_experiment

    uri, experiment_id = init_experiment(experiment)
    typer.echo(f"tracking URI: {uri}\nexperiment:   {experiment} (id {experiment_id})")


@tracking_app.command("reap")
def tracking_reap(
    stale_after: float = typer.Option(600.0, help="also reap runs whose heartbeat is older than this (seconds)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list what would be reaped, change nothing"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Mark RUNNING runs whose process is gone (on this host) or whose heartbeat stopped as KILLED."""
    from mlops.tracking import reap

    reaped = reap(stale_after=stale_after, dry_run=dry_run)
    if as_json:
        typer.echo(json.dumps([r.__dict__ for r in reaped], indent=2))
        return
    verb = "would reap" if dry_run else "reaped"
    for r in reaped:
        typer.echo(f"{verb} run {r.run_id} (experiment {r.experiment_id}): {r.reason}")
    typer.echo(f"{len(reaped)} run(s) {verb}")


@tracking_app.command("latest-run")
def tracking_latest_run(
    tag: list[str] = typer.Option(..., "--tag", help="KEY=VALUE the run must carry (repeatable)"),
    having: list[str] | None = typer.Option(None, "--having", help="a tag the run must carry, any value"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The newest FINISHED run carrying the tags (with --json, also all its tags): how scripts hand off between
    stages (by tags, not output)."""
    from mlops.errors import MLOpsError, NotFoundError
    from mlops.run_store import get_run, latest_run

    tags = {}
    for item in tag:
        key, sep, value = item.partition("=")
        if not sep:
            raise MLOpsError(f"--tag '{item}' is not KEY=VALUE. Fix: e.g. --tag mlops.stage=train.")
        tags[key] = value
    run_id = latest_run(tags, having=tuple(having or ()))
    if run_id is None:
        raise NotFoundError(f"no finished run carries {tags} (and {having or 'nothing else'}). Fix: run that stage "
                            "first.")
    if as_json:  # with the run's tags: the next stage reads what it needs (a snapshot id, a content id) from them
        typer.echo(json.dumps({"run_id": run_id, "tags": dict(get_run(run_id).data.tags)}))
    else:
        typer.echo(run_id)


@tracking_app.command("migrate-request-log")
def tracking_migrate_request_log(
    source: str | None = typer.Option(None, "--from", help="SQLAlchemy URL of the old tables (default: "
                                      "MLOPS_REQUEST_LOG_DB, MLOPS_REGISTRY_DB, then the tracking database)"),
) -> None:
    """Move the retired request-log tables into MLflow traces (answers) and assessments (feedback), then drop
    them. Reruns are no-ops."""
    from mlops.requestlog_migrate import migrate

    typer.echo(json.dumps(migrate(source)))


@app.command()
def info() -> None:
    """Where state lives: project home, tracking URI, image tag, git commit."""
    from mlops.lineage import code_version, git_state, image_tag
    from mlops.paths import project_home
    from mlops.tracking import tracking_uri

    tag, mutable = image_tag()
    commit, dirty = git_state()
    typer.echo(
        json.dumps(
            {
                "home": str(project_home()),
                "tracking_uri": tracking_uri(),
                "image_tag": tag,
                "image_tag_mutable": mutable,
                "git_commit": commit,
                "git_dirty": dirty,
                "code_version": code_version(),
            },
            indent=2,
        )
    )


@app.command()
def smoke(
    base_model: str = typer.Option(None, help="base model name or HF folder (overrides the config)"),
    prompt: str = typer.Option(None, help="user message to answer"),
    max_new_tokens: int = typer.Option(32, min=1, max=512),
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Greedy chat generation on a base model, logged as a run with every lineage tag."""
    from mlops.smoke import DEFAULT_PROMPT, run_smoke

    extra = [f"base_model={base_model}"] if base_model else []
    cfg = load(config, [*(overrides or []), *extra])
    run_id, generation = run_smoke(cfg, prompt or DEFAULT_PROMPT, max_new_tokens)
    typer.echo(f"prompt:     {generation.prompt}\ncompletion: {generation.text}\nrun id:     {run_id}")


def _register_stages() -> None:
    """The composition root: add every registered stage's commands (only a stage's own module imports it)."""
    from mlops.stages import load_stages, resolve

    if getattr(app, "_mlops_stages_added", False):
        return
    for name, target in load_stages().commands.items():
        commands = resolve(target)
        if isinstance(commands, typer.Typer):
            app.add_typer(commands, name=name)
        else:
            commands(app)
    app._mlops_stages_added = True


def _offline_defaults() -> None:
    # The hub is unreachable here; without these, transformers and datasets stall on network retries.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _quiet_store_tracebacks() -> None:
    # MLflow logs a database error with its traceback before raising it; the CLI says it once, as one paragraph.
    import logging

    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def _bounded_pools() -> None:
    # Each of MLflow's stores (tracking, registry) keeps its own SQLAlchemy pool of 5 + 10 by default: twenty
    # CLI processes at once would exhaust a PostgreSQL's max_connections, so one connection stays open per store.
    # A training process writes from up to four threads at once (the step loop, the heartbeat, MLflow's system
    # metrics monitor, the checkpoint finalizer), and one MLflow write can hold two connections: with room for
    # only 3, those threads starved each other until the pool's 30 s timeout, several times a run (a 12-step tiny
    # training took 113 s instead of 27). Extra connections are closed as soon as they are returned.
    os.environ.setdefault("MLFLOW_SQLALCHEMYSTORE_POOL_SIZE", "1")
    os.environ.setdefault("MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW", "8")


def main() -> None:
    _offline_defaults()
    _quiet_store_tracebacks()
    _bounded_pools()
    _register_stages()
    try:
        try:
            app()
        finally:
            _wait_for_display_copies()
    except MLOpsError as err:
        from mlops.text import shown_lines

        # An error may quote what someone typed (a model name, a comment): it must not act on the terminal.
        typer.echo(shown_lines(f"error: {err}"), err=True)
        sys.exit(err.exit_code)


def _wait_for_display_copies() -> None:
    """A registry act returns once its ledger entry commits; its MLflow display copies follow on a writer thread.
    The command ends when they have landed, and says so if they could not be written."""
    transition = sys.modules.get("registry.transition")
    if transition is not None:
        transition.flush_display(report=True)
