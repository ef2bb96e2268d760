"""One trial: sample, build the trial's config, train it as a nested MLflow run, report to the pruner, tell.

The trial's run is an ordinary training run (the trainer tags it with the trial config's hash, the snapshot
id and the image tag) plus the sweep tags, nested under the sweep's parent run. Whatever happens, the trial
ends in Optuna and in MLflow with the same verdict: COMPLETE, PRUNED (last metrics kept) or FAIL (reason).
"""

from __future__ import annotations

import math
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlops.errors import MLOpsError
from mlops.lineage import Tag
from training.sweep.objective import is_simulated_crash, objective_value
from training.sweep.plan import SweepPlan
from training.sweep.spaces import apply_values, suggest

RUN_ATTR = "mlflow_run_id"
HASH_ATTR = "config_hash"
REASON_ATTR = "fail_reason"
MODEL_ATTR = "model_uri"
OVERRIDES_ATTR = "overrides"
STEP_ATTR = "stopped_at_step"
WORKER_ATTR = "worker"
WORKER = f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Context:
    """What every trial of one worker shares."""

    plan: SweepPlan
    study: Any  # optuna.Study
    parent_run_id: str | None
    experiment: str
    trainer: Any  # training.sweep.objective.Trainer
    start_tracker: Callable[..., Any]  # (experiment, run_name, tags, parent_run_id) -> tracker
    log: Callable[[str], None] = print


@dataclass
class Outcome:
    number: int
    state: str  # COMPLETE, PRUNED or FAIL
    value: float | None = None
    run_id: str | None = None
    reason: str | None = None
    params: dict = field(default_factory=dict)


class _Pruned(Exception):
    pass


def trial_dir(plan: SweepPlan, number: int) -> Path:
    from mlops.paths import mlops_dir

    return mlops_dir() / "sweeps" / plan.study / f"trial-{number:04d}"


def trial_name(plan: SweepPlan, number: int) -> str:
    return f"{plan.study}-trial-{number}"


def trial_config(ctx: Context, trial, values: dict, root: int):
    """The trial's own config: base + sampled values, in the parent's experiment, own checkpoint folder."""
    from mlops.config import set_dotted, validate_config

    plan = ctx.plan
    data = apply_values(plan.params, values, plan.base)
    set_dotted(data, "run.experiment", ctx.experiment)
    set_dotted(data, "run.run_name", trial_name(plan, trial.number))
    set_dotted(data, "train.checkpoint.dir", str(trial_dir(plan, root) / "checkpoints"))
    cfg = validate_config(data, source=f"trial {trial.number}")
    if any(spec.key.startswith("data.") for spec in plan.params.values()):
        from mlops.data.build import build_snapshot

        # The build is content-keyed: trials with the same mix share one snapshot, built once.
        cfg.train.snapshot = build_snapshot(cfg).snapshot_id
    return cfg


def run_trial(ctx: Context, trial, root: int | None = None) -> Outcome:
    """Train one claimed trial and tell Optuna how it ended. `root` is the first trial of a retry chain, whose
    checkpoint folder a retried trial resumes from."""
    import optuna

    from mlops.config import config_hash

    plan, obj = ctx.plan, ctx.plan.objective
    outcome = Outcome(trial.number, "FAIL")
    root = trial.number if root is None else root
    tracker = None
    pruned_at: list[int] = []
    try:
        # The run exists before anything can fail, so every trial, even one whose config is refused, has one.
        tags = {Tag.SWEEP_STUDY: plan.study, Tag.SWEEP_TRIAL: trial.number, Tag.SWEEP_TRIAL_STATE: "RUNNING"}
        tracker = ctx.start_tracker(ctx.experiment, trial_name(plan, trial.number), tags, ctx.parent_run_id)
        outcome.run_id = tracker.run_id
        trial.set_user_attr(RUN_ATTR, tracker.run_id)
        trial.set_user_attr(WORKER_ATTR, WORKER)
        values = suggest(trial, plan.params)
        outcome.params = values
        tracker.log_params({f"sweep.{k}": v for k, v in values.items()})
        trial.set_user_attr(OVERRIDES_ATTR, [f"{plan.params[k].key}={v}" for k, v in values.items()])
        cfg = trial_config(ctx, trial, values, root)
        trial.set_user_attr(HASH_ATTR, config_hash(cfg))

        def report(step: int, metrics: dict) -> None:
            value = metrics.get(obj.intermediate)
            if value is None:
                return
            if not math.isfinite(value):
                raise MLOpsError(f"{obj.intermediate} is {value} at step {step}: the trial diverged.")
            trial.report(obj.sign * float(value), step)
            if trial.should_prune():
                pruned_at.append(step)
                trial.set_user_attr(STEP_ATTR, step)
                raise ctx.trainer.stop_exception(
                    f"pruned by the {plan.sweep.pruner.name} pruner at step {step} ({obj.intermediate}={value:.5g})")

        result = ctx.trainer.train(cfg, tracker, report)
        if pruned_at:
            raise _Pruned(getattr(result, "reason", None) or "pruned")
        outcome.value = objective_value(obj, result, cfg, tracker)
        if getattr(result, "model_uri", None):
            trial.set_user_attr(MODEL_ATTR, result.model_uri)
        ctx.study.tell(trial, outcome.value)
        outcome.state = "COMPLETE"
        _finish(tracker, "COMPLETE")
    except _Pruned as why:
        outcome.state, outcome.reason = "PRUNED", str(why)
        ctx.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        _finish(tracker, "PRUNED", reason=str(why))
    except KeyboardInterrupt:
        outcome.reason = "interrupted"
        _fail(ctx, trial, tracker, outcome.reason, status="KILLED")
        raise
    except BaseException as err:  # noqa: BLE001 - a crashed trial must not stop the study
        if not isinstance(err, Exception) and not is_simulated_crash(err):
            raise
        outcome.reason = str(err) if isinstance(err, MLOpsError) else f"{type(err).__name__}: {err}"
        _fail(ctx, trial, tracker, outcome.reason)
    finally:
        if not plan.sweep.keep_checkpoints:
            shutil.rmtree(trial_dir(plan, root), ignore_errors=True)
    ctx.log(_line(outcome))
    return outcome


def _finish(tracker, state: str, reason: str | None = None) -> None:
    """Mark the verdict on the run. Its metrics are the trainer's: a pruned run's latest values are those of
    the validation that pruned it."""
    if tracker is None:
        return
    tracker.set_tags({Tag.SWEEP_TRIAL_STATE: state, **({Tag.STOP_REASON: reason} if reason else {})})
    tracker.close("FINISHED")  # a no-op when the trainer closed it already


def _fail(ctx: Context, trial, tracker, reason: str, status: str = "FAILED") -> None:
    import optuna

    try:
        trial.set_user_attr(REASON_ATTR, reason[:2000])
    except Exception:  # noqa: BLE001 - a trial told already keeps its verdict
        pass
    ctx.study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    if tracker is not None:
        try:
            tracker.set_tags({Tag.SWEEP_TRIAL_STATE: "FAIL", Tag.FAILURE_REASON: reason[:4000]})
            tracker.close(status, reason=reason[:4000])
        except Exception as err:  # noqa: BLE001 - the study goes on even when tracking hiccups
            ctx.log(f"warning: could not mark run {tracker.run_id} failed: {err}")


def _line(o: Outcome) -> str:
    value = f" value={o.value:.5g}" if o.value is not None else ""
    why = f" ({o.reason})" if o.reason and o.state != "COMPLETE" else ""
    return f"trial {o.number}: {o.state}{value} run={o.run_id}{why}"
