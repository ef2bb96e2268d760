"""`mlops train ...`: run (one or several processes), worker (internal), drill, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.core import TyperGroup

from mlops.cli_options import ConfigOpt, OverridesArg, load, split_overrides
from mlops.errors import ConfigError

app = typer.Typer(help="DeepSpeed training on a data snapshot: run, kill drill, checkpoints.", no_args_is_help=True)


def _nproc(value: str, name: str = "nproc") -> int:
    """MLflow passes float parameters as '2.0'."""
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"--{name} '{value}' is not a number. Fix: pass a whole number such as --{name} 2.") from None
    if number != int(number) or number < 1:
        raise ConfigError(f"--{name} {value} is not a whole number >= 1. Fix: pass e.g. --{name} 2.")
    return int(number)


def _flag(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off", ""):
        return False
    raise ConfigError(f"--{name} '{value}' is not true or false. Fix: pass --{name} true or --{name} false.")


@app.command("run")
def run(
    config: Path | None = ConfigOpt,
    nproc: str = typer.Option("1", help="processes on this node (torchrun / deepspeed launcher when > 1)"),
    smoke: str = typer.Option("false", help="true: a few dozen steps that must lower the loss at a set speed"),
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Train the configured base model on a snapshot; resumes from the newest verified checkpoint."""
    from training.launch import run_training

    cfg = load(config, overrides)
    result = run_training(cfg, nproc=_nproc(nproc), smoke=_flag(smoke, "smoke"))
    metrics = result.get("metrics", {})
    summary = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, int | float))
    typer.echo(f"run {result['run_id']}: {result['status']} after {result['steps']} steps ({summary})")
    if result.get("model_uri"):
        typer.echo(f"model: {result['model_uri']} (HF folder {result['model_dir']})")
    if result.get("reason"):
        typer.echo(f"note: {result['reason']}")


@app.command("plan")
def plan(
    config: Path | None = ConfigOpt,
    gpu: str = typer.Option("cpu", help="hardware: l4, a10g, rtx4090 (24 GB), a100-40gb, l40s, a6000 (48 GB), "
                            "a100-80gb, h100-80gb, h100-94gb, h200, or cpu (this machine, measured); any other card "
                            "with --gpu-memory and --gpu-tflops"),
    gpu_memory: str = typer.Option("", help="memory per device in GiB: another card (with --gpu-tflops), or in "
                                   "place of a table card's"),
    gpu_tflops: str = typer.Option("", help="bf16 dense TFLOPS per device (no sparsity, fp32 accumulate): another "
                                   "card (with --gpu-memory), or in place of a table card's"),
    gpus: str = typer.Option("1", help="devices (processes on cpu)"),
    tokens: str = typer.Option("", help="tokens to train on (default: max_steps x global batch x mean sample)"),
    mfu: str = typer.Option("", help="model FLOPs utilisation, in (0, 1] (default 0.4 on GPUs)"),
    seq_len: str = typer.Option("", help="sequence length (default: train.max_seq_len, else the snapshot's)"),
    deadline: str = typer.Option("", help="a duration (36h, 2d) or a UTC date-time the job must finish by"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
    overrides: list[str] | None = OverridesArg,
) -> None:
    """FLOPs, peak memory per rank and wall time of a config on named hardware, and whether it fits and
    finishes in time: no weights loaded, no run started. Exits 3 when the job does not fit or misses the deadline."""
    from training import hardware
    from training.planner import describe, parse_deadline, plan_job

    cfg = load(config, overrides)
    hw = hardware.described(gpu, _number(gpu_memory, "gpu-memory"), _number(gpu_tflops, "gpu-tflops"))
    result = plan_job(cfg, hw=hw, gpus=_nproc(gpus, "gpus"), tokens=_number(tokens, "tokens"),
                      mfu=_number(mfu, "mfu"), seq_len=int(_number(seq_len, "seq-len") or 0) or None,
                      deadline_s=parse_deadline(deadline))
    typer.echo(json.dumps(result, indent=2) if as_json else describe(result))
    if not result["fits"] or result.get("meets_deadline") is False:
        raise typer.Exit(3)


def _number(value: str, name: str) -> float | None:
    """Options MLflow fills in: '' means unset, and numbers may come as '1e10' or '32.0'."""
    import math

    if not value.strip():
        return None
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"--{name} '{value}' is not a number. Fix: pass e.g. --{name} 1e10.") from None
    if not (number > 0 and math.isfinite(number)):
        raise ConfigError(f"--{name} {value} must be a finite number above 0. Fix: pass a positive number.")
    return number


@app.command("worker", hidden=True)
def worker_cmd(spec: Path = typer.Option(..., help="spec written by `mlops train run`")) -> None:
    """One rank of a multi-process run (started by the launcher)."""
    from training.launch import worker

    worker(spec)


@app.command("drill")
def drill(
    config: Path | None = ConfigOpt,
    nproc: str = typer.Option("1", help="processes per training run"),
    seed: int | None = typer.Option(None, help="seed for the kill step (default: random)"),
    steps: int = typer.Option(12, min=4, help="optimizer steps of each drill run"),
    overrides: list[str] | None = OverridesArg,
) -> None:
    """SIGKILL a short training's launcher at a random step after its first checkpoint, check that no worker
    survives it, resume, and compare every step with an uninterrupted run."""
    from training.drill import run_drill

    report = run_drill(config, split_overrides(overrides), nproc=_nproc(nproc), seed=seed, steps=steps)
    typer.echo(report.summary())
    if not report.passed:
        raise typer.Exit(1)


class _ListByDefault(TyperGroup):
    """`mlops train checkpoints [--dir D] [overrides]` lists, as it did before `prune` came; a sub-command's name
    first runs that sub-command."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] != "--help"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


checkpoints_app = typer.Typer(cls=_ListByDefault, help="List a folder's checkpoints (the default), or prune "
                              "checkpoints no registered version needs once their runs are released.")
app.add_typer(checkpoints_app, name="checkpoints")


@checkpoints_app.command("list")
def checkpoints(
    config: Path | None = ConfigOpt,
    directory: Path | None = typer.Option(None, "--dir", help="checkpoint folder (default: the config's)"),
    overrides: list[str] | None = OverridesArg,
) -> None:
    """List checkpoints with their step, completeness and hash verification, and who trains into the folder."""
    from training.checkpoint import list_tags, read_manifest, verify

    if directory is None:
        from mlops.config import config_hash
        from training.data_loader import resolve_snapshot_id
        from training.prepare import default_ckpt_dir

        cfg = load(config, overrides)
        cfg.train.snapshot = resolve_snapshot_id(cfg.train.snapshot)
        directory = Path(cfg.train.checkpoint.dir) if cfg.train.checkpoint.dir else default_ckpt_dir(config_hash(cfg))
    rows = []
    for step, folder in list_tags(directory):
        ok, reason = verify(folder)
        manifest = read_manifest(folder) or {}
        rows.append({"step": step, "path": str(folder), "ok": ok, "reason": reason,
                     "run_id": manifest.get("run_id"), "world_size": manifest.get("world_size")})
    typer.echo(json.dumps(rows, indent=2) if rows else f"no checkpoints under {directory}")
    from training.lock import TrainLock

    holder = TrainLock(directory).holder()
    if holder:
        typer.echo(f"lock: {holder}")


@checkpoints_app.command("prune")
def checkpoints_prune(
    root: Path | None = typer.Option(None, "--root", help="where to look (default: the checkpoints root, "
                                     "MLOPS_CHECKPOINTS_DIR or .mlops/checkpoints); every folder below it with "
                                     "step-* checkpoints, team prefixes included"),
    do_apply: bool = typer.Option(False, "--apply", help="delete (default: a dry run that deletes nothing)"),
    as_json: bool = typer.Option(False, "--json", help="print the plan (and what was deleted) as JSON"),
) -> None:
    """After release, delete the checkpoints no registered version needs: never the selected best, never one a
    version names, nothing in a folder whose run is in progress or may resume. A dry run unless --apply."""
    from mlops.paths import checkpoints_dir
    from training.prune import apply, describe, plan_prune, registered_versions

    folder = (root or checkpoints_dir()).expanduser().resolve()
    if not folder.is_dir():
        if root is not None:
            raise ConfigError(f"--root {folder} is not a folder. Fix: pass the folder that holds the checkpoint "
                              "folders, e.g. --root .mlops/checkpoints.")
        typer.echo(f"no checkpoints under {folder}")
        return
    plan = plan_prune(folder, registered_versions())
    deleted, errors = apply(plan) if do_apply else (None, [])
    if as_json:
        freed = None if deleted is None else sum(deleted.values())
        typer.echo(json.dumps({**plan.as_dict(), "applied": do_apply, "deleted": deleted, "freed_bytes": freed,
                               "errors": errors}, indent=2))
    else:
        typer.echo(describe(plan, deleted, errors))
    if errors:
        raise typer.Exit(1)


# --------------------------------------------------------------------------- training as a service (Ray)


@app.command("submit")
def submit_cmd(
    config: Path | None = ConfigOpt,
    team: str = typer.Option(..., help="the team the job runs for (registry.teams in the signed policy)"),
    priority: str = typer.Option("", help="high, normal or low (default: the team's default_priority)"),
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Admit a training job (identity, team, fences, plan, quota) and queue it on the Ray cluster
    (train.cluster.address, RAY_ADDRESS, else a local head); it trains with Ray Train when its turn comes."""
    from training.submit import submit

    sub = submit(load(config, overrides), team=team, priority=priority.strip() or None)
    typer.echo(f"job {sub.job_id} queued for team {sub.team} ({sub.priority}) on {sub.address}: {sub.devices} "
               f"devices, {sub.planned_hours:.4f} device-hours planned; {sub.quota_left:.4f} left of the team's quota "
               f"this month after it. Runs go to experiment {sub.experiment}. See `mlops train queue`.")


@app.command("queue")
def queue_cmd(
    address: str = typer.Option("", help="the cluster's dashboard (default: train.cluster.address / RAY_ADDRESS / "
                                "the local head)"),
    team: str = typer.Option("", help="only this team's jobs"),
    as_json: bool = typer.Option(False, "--json", help="print the jobs as JSON"),
) -> None:
    """The service's jobs: team, user, priority, state, planned hours, queue position and expected start."""
    from training.queue_view import queue_rows, render

    rows = queue_rows(address.strip() or None, team=team.strip() or None)
    typer.echo(json.dumps(rows, indent=2) if as_json else render(rows))


@app.command("cancel")
def cancel_cmd(
    job: str = typer.Argument(..., help="the job id (`mlops train queue`)"),
    address: str = typer.Option("", help="the cluster's dashboard (default as for queue)"),
) -> None:
    """Stop a queued or running job (its submitter or an admin); its checkpoints stay, and a new submission of
    the same config resumes from them."""
    from training.queue_view import cancel

    typer.echo(cancel(job, address.strip() or None))


@app.command("job", hidden=True)
def job_cmd() -> None:
    """The driver of an admitted job (the Ray job's entrypoint)."""
    from training.ray_job import run_job

    raise typer.Exit(run_job())


@app.command("attest")
def attest_cmd(run: str = typer.Argument(..., help="the MLflow run of a finished service job")) -> None:
    """Sign a finished `train submit` job's output as its submitter (jobs on the cluster hold no one's key);
    registration needs this training attestation."""
    from training.attest import attest_job_run

    typer.echo(f"run {run} attested (attestation {attest_job_run(run)[:12]})")
