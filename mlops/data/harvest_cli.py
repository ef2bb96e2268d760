"""`mlops data harvest ...`: served requests with negative feedback or corrections -> a reviewed data source."""

from __future__ import annotations

from pathlib import Path

import typer

from mlops.cli_options import ConfigOpt, OverridesArg, load

app = typer.Typer(help="The loop back: `harvest --since <time> --out <folder>` collects served requests with "
                       "negative feedback or corrections for review; `harvest accept <folder>` turns the accepted "
                       "ones into a data source (and, with --build, a snapshot mixed with history).",
                  invoke_without_command=True)


@app.callback()
def harvest(ctx: typer.Context,
            since: str | None = typer.Option(None, "--since", help="ISO time: feedback given since then"),
            out: Path | None = typer.Option(None, "--out", help="folder of the increment (re-running merges)"),
            model: str | None = typer.Option(None, "--model", help="only requests served by this model")) -> None:
    """Write <out>/increment.jsonl: one row per request to review; set "accepted" to true or false on each."""
    if ctx.invoked_subcommand:
        return
    if not since or not out:
        from mlops.errors import MLOpsError

        raise MLOpsError("`mlops data harvest` needs --since <ISO time> and --out <folder>. Fix: e.g. `mlops data "
                         "harvest --since 2026-11-30T00:00:00Z --out data/harvest/round3`.")
    from mlops.data.harvest import harvest as run

    s = run(since, out, model=model)
    typer.echo(f"{s['rows']} requests to review in {s['path']} ({s['added']} new, {s['pending']} pending; "
               f"{s['feedback_without_request']} feedback rows whose request is no longer logged)\n"
               f"next: set \"accepted\": true/false (and a \"correction\" where missing), then "
               f"`mlops data harvest accept {out}`")


@app.command("accept")
def accept(folder: Path = typer.Argument(..., help="the increment's folder"),
           build: bool = typer.Option(False, "--build", help="also build the snapshot (needs --config)"),
           config: Path | None = ConfigOpt,
           history: str | None = typer.Option(None, "--history", help="snapshot id to mix in (the one the current "
                                                                       "model was trained on)"),
           ratio: float | None = typer.Option(None, "--ratio", help="history share of the train split (default 0.3: "
                                                                     "7:3 new to old)"),
           domain: str | None = typer.Option(None, "--domain", help="capability domain of the harvested records"),
           overrides: list[str] | None = OverridesArg) -> None:
    """Write <folder>/accepted.jsonl (conversations whose answer is the correction) and its provenance."""
    from mlops.data.harvest import accept as run
    from mlops.data.harvest import increment_config

    s = run(folder)
    typer.echo(f"{s['accepted']} accepted ({s['rejected']} rejected, {s['pending']} pending) -> {s['path']}")
    if not build:
        typer.echo(f"build it with: mlops data harvest accept {folder} --build --config <yaml> --history <snapshot>")
        return
    from mlops.data.tracked_build import run_build

    cfg = increment_config(load(config, overrides), folder, history=history, ratio=ratio, domain=domain)
    result, run_id = run_build(cfg)
    history_mix = result.manifest.get("mixing", {}).get("history") or {}
    typer.echo(f"snapshot {result.snapshot_id}: {result.manifest['counts']['samples']} "
               f"(history {history_mix.get('snapshot', 'none')}: {history_mix.get('samples', 0)} samples)\n"
               f"  path {result.path}\n  run  {run_id}")
