"""CLI wrappers for evaluation, gates, contamination and shadow reports."""

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
    from mlops.cli_options import load

    cfg = load(config, overrides)
    if cfg.eval is None:  # every eval setting has a sensible default
        cfg.eval = EvalConfig()
    return cfg


def eval_command(
    model: str = ModelOpt,
    suites: str | None = typer.Option(None, "--suites", "-s", help="comma-separated suite names (default: eval.suites)"),
    profile: Path | None = ProfileOpt,
    force_profile: bool = ForceOpt,
    reference: bool = typer.Option(False, "--reference", help="judge the version's reference form (its profile "
                                   "on hf, weights as trained): the baseline of the quantization gate"),
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Evaluate a model in deployment form: serve it, run lm-eval suites through the endpoint, log to MLflow."""
    from evaluation.runner import run_eval

    outcome = run_eval(_config(config, overrides), model, suites=suites or None, profile_path=profile,
                       force_profile=force_profile, reference=reference)
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
    from mlops.model_refs import resolve_model_ref, set_version_tags

    cfg = _config(config, overrides)
    resolved = resolve_model_ref(model)
    report = contamination_for_model(resolved, get_suites(suites, cfg.eval.suite_paths), cfg.eval.contamination,
                                     snapshot=snapshot)
    set_version_tags(resolved, contamination_tags(report))
    typer.echo(json.dumps(report, indent=2))


shadow_app = typer.Typer(help="Compare a shadowed candidate's answers with the answers users got.",
                         no_args_is_help=True)


@shadow_app.command("report")
def shadow_report(
    model: str = typer.Argument(..., help="registered model name"),
    version: str = typer.Argument(..., help="the candidate version that ran as a shadow"),
    since: str | None = typer.Option(None, help="only shadow answers since: 24h, 7d, an ISO time or epoch seconds"),
    scorer: str | None = typer.Option(None, help="win-rate scorer (default: serve.shadow.scorer), e.g. "
                                      "reference_overlap"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Agreement, length and latency deltas, refusal and error rates, and a win rate with a scorer; stored as a
    `shadow` run, the evidence the registry's shadow gate reads."""
    from evaluation.shadow import SCORERS, log_shadow_report, parse_since, render, shadow_evidence
    from mlops.cli_options import load
    from serving.config import ServeConfig

    serve_cfg = load(config, overrides).serve or ServeConfig()
    scorer = scorer or serve_cfg.shadow.scorer
    if scorer:
        SCORERS.get(scorer)  # an unknown name fails before the log is read
    report = shadow_evidence(model, version, since=parse_since(since), scorer=scorer,
                             url=serve_cfg.request_log.database)
    report["run_id"] = log_shadow_report(report)  # the stored evidence the registry's shadow gate reads
    typer.echo(json.dumps(report, indent=2) if as_json else render(report) + f"\n(stored as run {report['run_id']})")


def pair_suite(
    snapshot: str = typer.Option(..., "--snapshot", help="the DPO round's preference snapshot (its validation pairs "
                                 "are held out)"),
    out: Path = typer.Option(..., "--out", help="folder to write the `pairs` suite into (then eval.suite_paths)"),
    base_model: str = typer.Option(..., "--base-model", help="base model (catalog name or folder) whose tokenizer "
                                   "built the snapshot"),
    limit: int | None = typer.Option(None, "--limit", help="at most this many pairs"),
    judged: list[str] = typer.Option([], "--judged", help="a model the suite will judge (repeatable; e.g. the "
                                     "DPO candidate): pairs its training snapshot holds are left out"),
    config: Path | None = ConfigOpt,
    as_json: bool = typer.Option(False, "--json", help="print the suite folder, the pair ids it holds and those "
                                 "left out per judged model as JSON"),
) -> None:
    """Write a preference snapshot's held-out pairs as the `pairs` eval suite (task pairs_heldout, metric acc), less
    the pairs any --judged model was trained on (they would score its memory, and its eval would stop at them)."""
    from evaluation.pairs import TASK, seen_in_training, suite_ids, write_pair_suite
    from mlops.base_models import ensure_base_model
    from mlops.model_refs import resolve_model_ref

    tokenizer_path = ensure_base_model(base_model)["path"]
    folder = write_pair_suite(snapshot, out, tokenizer_path=tokenizer_path, limit=limit)
    seen = seen_in_training(folder, [resolve_model_ref(ref) for ref in judged], _config(config, None).eval.contamination)
    left_out = {item for ids in seen.values() for item in ids}
    if left_out:
        folder = write_pair_suite(snapshot, out, tokenizer_path=tokenizer_path, limit=limit, leave_out=left_out)
    if as_json:
        typer.echo(json.dumps({"suite": str(folder), "pairs": suite_ids(folder), "left_out": seen}, indent=2))
        return
    for ref, ids in seen.items():
        typer.echo(f"{ref}: trained on {len(ids)} of the held-out pairs" + (f", left out: {', '.join(ids)}" if ids
                                                                           else ""))
    typer.echo(f"wrote suite pairs ({TASK}) to {folder}\nevaluate with: eval.suites=[general,business,pairs] "
               f"eval.suite_paths=[{out}]; gate with eval.gate.must_improve=[{TASK}]")


def register(app: typer.Typer) -> None:
    """Add `shadow`, `eval`, `gate`, `contamination` and `pair-suite` to the top-level app."""
    app.add_typer(shadow_app, name="shadow")
    app.command("pair-suite")(pair_suite)
    app.command("eval")(eval_command)
    app.command("gate")(gate)
    app.command("contamination")(contamination)
