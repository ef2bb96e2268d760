"""`mlops data ...`: build, rebuild, show, verify and list snapshots; list gate suites; generate the sample data.

`mlflow run mlproject -e data -P config=...` calls `mlops data build --config {config} {overrides}`.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mlops.cli_options import ConfigOpt, OverridesArg, load
from mlops.data.harvest_cli import app as harvest_app
from mlops.data.tracked_build import run_build

app = typer.Typer(help="Data snapshots: build, show, verify, list; sample data; harvest feedback.",
                  no_args_is_help=True)
# Top-down: this module registers the harvest commands; mlops.data.harvest_cli imports nothing of it (both run builds
# through mlops.data.tracked_build).
app.add_typer(harvest_app, name="harvest")
RootOpt = typer.Option(None, "--root", help="snapshots folder (default .mlops/snapshots)")


@app.command("build")
def build(
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
    force: bool = typer.Option(False, "--force", help="rebuild even if these inputs were built before"),
) -> None:
    """Build a data snapshot from the config's `data:` section (a no-op when already built)."""
    cfg = load(config, overrides)
    _report(*run_build(cfg, force=force))


@app.command("rebuild")
def rebuild(snapshot_id: str = typer.Argument(..., help="snapshot id (or unique prefix) to build again"),
            root: Path | None = RootOpt) -> None:
    """Rebuild a snapshot from the config recorded in its manifest, replacing its folder if it fails verification."""
    from mlops.config import validate_config
    from mlops.data.format import read_manifest
    from mlops.data.snapshot import resolve_snapshot
    from mlops.errors import MLOpsError

    folder = resolve_snapshot(snapshot_id, root)
    m = read_manifest(folder)
    # Where it ran is no part of what it is: a rebuild runs here, whatever cluster built it (that may be gone).
    data = {k: v for k, v in m["config"].items() if k not in ("executor", "ray")} | {"output_dir": str(folder.parent)}
    cfg = validate_config({"base_model": m.get("base_model_ref") or m["base_model"]["name"],
                           "run": {"seed": m["seed"], "experiment": "data"}, "data": data},
                          source=f"the manifest of {folder.name}")
    result, run_id = run_build(cfg, force=True)
    _report(result, run_id)
    if result.snapshot_id != folder.name:
        raise MLOpsError(
            f"the rebuild produced {result.snapshot_id}, not {folder.name}: its sources or base model changed since "
            f"(the manifest records their hashes). {folder.name} is left as it was. Fix: restore the inputs it was "
            "built from, or use the new snapshot and delete the old folder."
        )


def _report(result, run_id: str) -> None:
    m = result.manifest
    state = "already built (no work done)" if result.noop else f"built in {m.get('build_seconds')} s"
    samples = m.get("counts", {}).get("samples", {})
    gate = m.get("gate", {})
    typer.echo(f"snapshot {result.snapshot_id}: {state}")
    typer.echo(f"  path     {result.path}")
    typer.echo(f"  samples  train={samples.get('train', 0)} validation={samples.get('validation', 0)}")
    typer.echo(f"  gate     {gate.get('suite')}: {gate.get('passed')} batches passed, "
               f"{gate.get('quarantined')} quarantined")
    issues = m.get("issues", {})
    if issues.get("count"):
        typer.echo(f"  issues   {issues['count']} bad input rows quarantined, e.g.:")
        for item in issues.get("listed", [])[:5]:
            typer.echo(f"    {item['file']}:{item['line']} [{item.get('code', '')}] {item['problem']}")
    verdict = (m.get("acceptance") or {}).get("verdict")
    if verdict:
        why = f" ({', '.join(verdict['reasons'])})" if verdict["reasons"] else ""
        typer.echo(f"  accept   {verdict['status']}: rejected {verdict['rejected_share']:.1%} of rows read, limit "
                   f"{verdict['max_rejected_share']:.1%}{why}; `mlops data show {result.snapshot_id}` has the report")
    typer.echo(f"  run      {run_id}")


def _latest(snapshot_id: str, root: Path | None) -> str:
    """`latest` names the newest complete snapshot (a convenience for people, not for pipelines)."""
    if snapshot_id != "latest":
        return snapshot_id
    from mlops.data.snapshot import list_snapshots
    from mlops.errors import NotFoundError

    found = list_snapshots(root)
    if not found:
        raise NotFoundError("there is no snapshot yet. Fix: build one with `mlops data build --config <yaml>`.")
    return found[0]["snapshot_id"]


@app.command("show")
def show(
    snapshot_id: str = typer.Argument(..., help="snapshot id, a unique prefix, or `latest`"),
    as_json: bool = typer.Option(False, "--json", help="print the whole manifest as JSON"),
    root: Path | None = RootOpt,
) -> None:
    """Print a snapshot's manifest readably."""
    from mlops.data.format import read_manifest
    from mlops.data.manifest import describe
    from mlops.data.snapshot import resolve_snapshot

    folder = resolve_snapshot(_latest(snapshot_id, root), root)
    manifest = read_manifest(folder)
    typer.echo(json.dumps(manifest, indent=2, sort_keys=True) if as_json else describe(manifest))
    if not as_json:
        from mlops.data.review import review_line

        typer.echo(review_line(folder, manifest))


@app.command("review")
def review(
    snapshot_id: str = typer.Argument(..., help="snapshot id, a unique prefix, or `latest`"),
    n: int | None = typer.Option(None, "--n", help="draw this many kept samples for a person to judge (JSONL)"),
    verdicts: Path | None = typer.Option(None, "--verdicts", help="store the filled-in JSONL (verdict ok, or bad "
                                         "with a reason, on every line) with the snapshot"),
    seed: int = typer.Option(7, "--seed", help="sampling seed (same seed, same sample)"),
    out: Path | None = typer.Option(None, "--out", help="where the drawn JSONL goes (default beside the snapshot)"),
    reviewer: str = typer.Option("", "--reviewer", help="who judged (stored with the verdicts)"),
    root: Path | None = RootOpt,
) -> None:
    """Human review of kept records: draw a seeded, domain-stratified sample, or store its verdicts."""
    from mlops.data import review as rv
    from mlops.data.snapshot import resolve_snapshot
    from mlops.errors import MLOpsError

    if (n is None) == (verdicts is None):
        raise MLOpsError("pass exactly one of --n (draw a sample) and --verdicts FILE (store a filled-in one). "
                         "Fix: `mlops data review <snapshot> --n 200`, then `... --verdicts <file>`.")
    folder = resolve_snapshot(_latest(snapshot_id, root), root)
    if n is not None:
        path, items = rv.draw(folder, n, seed, out)
        per = ", ".join(f"{d} {k}" for d, k in sorted(rv.Counter(i["domain"] for i in items).items()))
        typer.echo(f"{len(items)} samples of {folder.name} ({per}) in {path}. Set \"verdict\" to ok, or to bad with "
                   f"a \"reason\", on every line, then: mlops data review {folder.name} --verdicts {path}")
        return
    s = rv.store(folder, verdicts, reviewer)
    typer.echo(f"review of {folder.name}: {s['judged']}/{s['drawn']} judged, {s['ok']} ok, {s['bad']} bad"
               + (f" ({', '.join(f'{k} {v}' for k, v in s['bad_reasons'].items())})" if s["bad"] else "")
               + ("; complete" if s["complete"] else f"; INCOMPLETE: {s['missing']} without a verdict"))


@app.command("verify")
def verify(snapshot_id: str = typer.Argument(..., help="snapshot id, folder or `latest`"),
           root: Path | None = RootOpt) -> None:
    """Re-hash every file of a snapshot against its manifest; exits non-zero on any change."""
    from mlops.data.snapshot import verify_snapshot

    result = verify_snapshot(_latest(snapshot_id, root), root)
    typer.echo(f"snapshot {result['snapshot_id']}: {result['files']} files verified, unchanged")


@app.command("list")
def list_cmd(root: Path | None = RootOpt) -> None:
    """List complete snapshots, newest first."""
    from mlops.data.snapshot import list_snapshots

    for m in list_snapshots(root):
        samples = m.get("counts", {}).get("samples", {})
        typer.echo(f"{m['snapshot_id']}  {m.get('created_at', '')}  {m.get('name', '')}  "
                   f"train={samples.get('train', 0)} validation={samples.get('validation', 0)}")


@app.command("suites")
def suites() -> None:
    """List the registered Great Expectations batch suites with their versions."""
    from mlops.data.gate import SUITES

    for name in SUITES.names():
        spec = SUITES.get(name)
        typer.echo(f"{spec.key:24} {spec.description}")


@app.command("sample")
def sample(
    out: Path = typer.Option(Path("data/generated"), "--out", help="folder for the generated files"),
    scale: int = typer.Option(1, "--scale", min=1, help="multiply the number of records"),
    seed: int = typer.Option(7, "--seed", help="generator seed (same seed, same files)"),
    round_: int = typer.Option(1, "--round", min=1, max=2, help="1: the first corpus; 2: the incremental round, "
                               "covering the policy facts round 1 leaves out (write it to another --out)"),
    eval_sets: str = typer.Option("evaluation/suites/**/*.jsonl", "--eval-sets",
                                  help="glob (under the project home) of eval files to leak a few items from"),
) -> None:
    """Generate the policy-grounded support sample data (with planted duplicates, PII, junk, leaks, a bad batch)."""
    from mlops.data.decontam import resolve_eval_sets
    from mlops.data.sample import generate
    from mlops.paths import project_home

    files, _ = resolve_eval_sets([eval_sets], project_home()) if eval_sets else ([], [])
    summary = generate(out, scale=scale, seed=seed, eval_files=files, round_=round_)
    for name, count in summary.items():
        typer.echo(f"{name:40} {count}")

