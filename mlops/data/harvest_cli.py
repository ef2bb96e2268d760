"""`mlops data harvest ...`: served requests with negative feedback or corrections -> a reviewed data source;
with --pairs, corrections, spot-check verdicts and rated shadow answers -> reviewed preference pairs.

It sits below mlops.data.cli, which registers this app as `mlops data harvest`; it imports nothing of it (the build
it runs comes from mlops.data.tracked_build)."""

from __future__ import annotations

from pathlib import Path

import typer

from mlops.cli_options import ConfigOpt, OverridesArg, load

app = typer.Typer(help="The loop back: `harvest --since <time> --out <folder>` collects served requests with "
                       "negative feedback or corrections for review; `harvest accept <folder>` turns the accepted "
                       "ones into a data source (and, with --build, a snapshot mixed with history). With --pairs: "
                       "preference pairs (corrections, spot-check verdicts, rated shadow answers) for a DPO "
                       "snapshot.",
                  invoke_without_command=True)


@app.callback()
def harvest(ctx: typer.Context,
            since: str | None = typer.Option(None, "--since", help="ISO time: feedback given since then"),
            out: Path | None = typer.Option(None, "--out", help="folder of the increment (re-running merges)"),
            model: str | None = typer.Option(None, "--model", help="only requests served by this model"),
            pairs: bool = typer.Option(False, "--pairs", help="harvest preference pairs into <out>/pairs.jsonl "
                                       "instead of corrected chats"),
            spotchecks: list[Path] | None = typer.Option(
                None, "--spotchecks", help="with --pairs: a reviewed `mlops registry spot-check export` file "
                "(repeatable)")) -> None:
    """Write <out>/increment.jsonl (or <out>/pairs.jsonl with --pairs): one row per request or pair to review; set
    "accepted" to true or false on each."""
    if ctx.invoked_subcommand:
        return
    if pairs or spotchecks:
        _harvest_pairs(since, out, model, spotchecks or [], pairs)
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


def _harvest_pairs(since: str | None, out: Path | None, model: str | None, spotchecks: list[Path],
                   pairs: bool) -> None:
    from mlops.errors import MLOpsError

    if not pairs:
        raise MLOpsError("--spotchecks makes preference pairs. Fix: add --pairs, e.g. `mlops data harvest --pairs "
                         "--spotchecks items.jsonl --out data/harvest/pairs`.")
    if not out:
        raise MLOpsError("`mlops data harvest --pairs` needs --out <folder>. Fix: e.g. `mlops data harvest --pairs "
                         "--since 2026-11-30T00:00:00Z --out data/harvest/pairs`.")
    from mlops.data.harvest_pairs import harvest_pairs

    s = harvest_pairs(since, out, model=model, spotchecks=spotchecks)
    kinds = ", ".join(f"{k} {n}" for k, n in s["by_kind"].items()) or "none new"
    dropped = ", ".join(f"{k} {n}" for k, n in s["dropped"].items()) or "none"
    typer.echo(f"{s['rows']} pairs to review in {s['path']} ({s['added']} new: {kinds}; {s['pending']} pending; "
               f"dropped: {dropped})\n"
               f"next: set \"accepted\": true/false on each (edit \"chosen\" where it is not right), then "
               f"`mlops data harvest accept {out} --pairs`")


@app.command("accept")
def accept(folder: Path = typer.Argument(..., help="the increment's folder"),
           build: bool = typer.Option(False, "--build", help="also build the snapshot (needs --config)"),
           config: Path | None = ConfigOpt,
           history: str | None = typer.Option(None, "--history", help="snapshot id to mix in (the one the current "
                                                                       "model was trained on)"),
           ratio: float | None = typer.Option(None, "--ratio", help="history share of the train split (default 0.3: "
                                                                     "7:3 new to old)"),
           domain: str | None = typer.Option(None, "--domain", help="capability domain of the harvested records"),
           pairs: bool = typer.Option(False, "--pairs", help="accept <folder>/pairs.jsonl into accepted-pairs.jsonl "
                                      "(a preference source; --build makes a preference snapshot)"),
           overrides: list[str] | None = OverridesArg) -> None:
    """Write <folder>/accepted.jsonl (conversations whose answer is the correction) and its provenance; with
    --pairs, <folder>/accepted-pairs.jsonl (preference pairs) and its provenance."""
    if pairs:
        _accept_pairs(folder, build, config, history, ratio, domain, overrides)
        return
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


def _accept_pairs(folder: Path, build: bool, config: Path | None, history: str | None, ratio: float | None,
                  domain: str | None, overrides: list[str] | None) -> None:
    from mlops.data.harvest_pairs import accept_pairs, pairs_config
    from mlops.errors import MLOpsError

    if history or ratio is not None:
        raise MLOpsError("--history/--ratio mix rows of an earlier snapshot one by one, which would split pairs. Fix: "
                         "drop them; deduplicate against the earlier snapshot with data.dedup.against_snapshots.")
    s = accept_pairs(folder)
    kinds = ", ".join(f"{k} {n}" for k, n in s["by_kind"].items())
    typer.echo(f"{s['accepted']} pairs accepted ({kinds}; {s['rejected']} rejected, {s['pending']} pending) -> "
               f"{s['path']}")
    if not build:
        typer.echo(f"build it with: mlops data harvest accept {folder} --pairs --build --config <yaml>")
        return
    from mlops.data.tracked_build import run_build

    result, run_id = run_build(pairs_config(load(config, overrides), folder, domain=domain))
    typer.echo(f"preference snapshot {result.snapshot_id}: {result.manifest.get('pairs', {}).get('total', 0)} pairs "
               f"{result.manifest['counts']['samples']} rows\n  path {result.path}\n  run  {run_id}")
