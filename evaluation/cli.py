"""CLI wrappers for serving, evaluation and gates."""

from __future__ import annotations

import json
from pathlib import Path

import typer

ModelOpt = typer.Option(..., "--model", "-m", help="models:/name@alias, models:/name/version, runs:/<id>/model or a folder")
ProfileOpt = typer.Option(None, "--profile", help="a deployment profile YAML other than the model's own")
ForceOpt = typer.Option(False, "--force-profile", help="allow a profile other than the released one (labelled)")
ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file (its eval: section)")
OverridesArg = typer.Argument(None, help="key=value overrides, e.g. eval.limit=10", show_default=False)


def _config(config: Path | None, overrides: list[str] | None):
    from evaluation.config import EvalConfig
    from mlops.cli import load

    cfg = load(config, overrides)
    if cfg.eval is None:  # every eval setting has a sensible default
        cfg.eval = EvalConfig()
    return cfg


def serve(
    model: str = ModelOpt,
    profile: Path | None = ProfileOpt,
    force_profile: bool = ForceOpt,
    host: str = typer.Option("127.0.0.1", help="interface to listen on"),
    port: int = typer.Option(8000, min=1, max=65535),
    name: str | None = typer.Option(None, help="model id the server answers to (default: from the ref)"),
    threads: int | None = typer.Option(None, min=1, help="torch threads (default: cores - 1, or MLOPS_SERVE_THREADS)"),
) -> None:
    """Serve a model version over an OpenAI-compatible API, configured by its deployment profile."""
    from evaluation.profile import ProfileMismatchError, check_template, choose_eval_profile, read_profile
    from evaluation.server import serve as run_server
    from registry.versions import resolve_model_ref

    resolved = resolve_model_ref(model)
    chosen, diffs = choose_eval_profile(resolved.profile(), read_profile(profile) if profile else None,
                                        force=force_profile)
    problem = check_template(chosen, resolved.hf_dir)
    if problem and not force_profile:
        raise ProfileMismatchError(f"{problem}. Fix: serve with the profile made for this tokenizer, or --force-profile.")
    for diff in diffs:
        typer.echo(f"warning: forced profile differs from the released one: {diff}", err=True)
    served = name or resolved.served_name
    typer.echo(f"serving {served} ({resolved.hf_dir}) on http://{host}:{port}/v1, profile {chosen.profile_hash()}",
               err=True)
    run_server(resolved.hf_dir, chosen, host=host, port=port, model_name=served, threads=threads)


def eval_command(
    model: str = ModelOpt,
    suites: str | None = typer.Option(None, "--suites", "-s", help="comma-separated suite names (default: eval.suites)"),
    profile: Path | None = ProfileOpt,
    force_profile: bool = ForceOpt,
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Evaluate a model in deployment form: serve it, run lm-eval suites through the endpoint, log to MLflow."""
    from evaluation.runner import run_eval

    outcome = run_eval(_config(config, overrides), model, suites=suites or None, profile_path=profile,
                       force_profile=force_profile)
    for score in outcome.scores:
        typer.echo(f"{score.suite:9} {score.name:28} {score.metric:12} {score.value:.3f} ± {score.stderr:.3f}  (n={score.n})")
    if outcome.contamination:
        typer.echo(f"contamination: {outcome.contamination['status']}, offending items: {outcome.contamination['count']}")
    typer.echo(f"eval run: {outcome.run_id}  ({outcome.wall_s:.1f} s)")


def gate(
    challenger: str = typer.Option(..., "--challenger", help="model ref to release"),
    champion: str | None = typer.Option(None, "--champion", help="current champion, e.g. models:/name@production"),
    history: list[str] | None = typer.Option(None, "--history", help="past champion refs (repeatable)"),
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Compare a challenger's eval with the champion's (and past champions'); write the report, tag the version."""
    from evaluation.gate_run import render, run_gate

    outcome = run_gate(_config(config, overrides), challenger, champion or None, history=history or [])
    typer.echo(render(outcome))
    if not outcome.report.passed:
        raise typer.Exit(1)


def contamination(
    model: str = ModelOpt,
    suites: str = typer.Option("general,business", "--suites", "-s"),
    snapshot: str | None = typer.Option(None, help="snapshot id or folder (default: from the model's lineage)"),
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Eval items held by the model's training snapshot (under its decontamination rule), tagged on the version."""
    from evaluation.contamination import contamination_for_model
    from evaluation.runner import contamination_tags
    from evaluation.suites import get_suites
    from registry.versions import resolve_model_ref, set_version_tags

    cfg = _config(config, overrides)
    resolved = resolve_model_ref(model)
    report = contamination_for_model(resolved, get_suites(suites, cfg.eval.suite_paths), cfg.eval.contamination,
                                     snapshot=snapshot)
    set_version_tags(resolved, contamination_tags(report))
    typer.echo(json.dumps(report, indent=2))


def register(app: typer.Typer) -> None:
    """Add `serve`, `eval`, `gate` and `contamination` to the top-level app."""
    app.command("serve")(serve)
    app.command("eval")(eval_command)
    app.command("gate")(gate)
    app.command("contamination")(contamination)
