"""`mlops train ...`: run (one or several processes), worker (internal), drill, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import typer

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
    gpu: str = typer.Option("cpu", help="hardware: a100-80gb, h100-80gb, h200 or cpu (this machine, measured)"),
    gpus: str = typer.Option("1", help="devices (processes on cpu)"),
    tokens: str = typer.Option("", help="tokens to train on (default: max_steps x global batch x mean sample)"),
    mfu: str = typer.Option("", help="model FLOPs utilisation (default 0.4 on GPUs)"),
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
    result = plan_job(cfg, hw=hardware.named(gpu), gpus=_nproc(gpus, "gpus"), tokens=_number(tokens, "tokens"),
                      mfu=_number(mfu, "mfu"), seq_len=int(_number(seq_len, "seq-len") or 0) or None,
                      deadline_s=parse_deadline(deadline))
    typer.echo(json.dumps(result, indent=2) if as_json else describe(result))
    if not result["fits"] or result.get("meets_deadline") is False:
        raise typer.Exit(3)


def _number(value: str, name: str) -> float | None:
    """Options MLflow fills in: '' means unset, and numbers may come as '1e10' or '32.0'."""
    if not value.strip():
        return None
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"--{name} '{value}' is not a number. Fix: pass e.g. --{name} 1e10.") from None
    if not number > 0:
        raise ConfigError(f"--{name} {value} must be above 0. Fix: pass a positive number.")
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


@app.command("checkpoints")
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
