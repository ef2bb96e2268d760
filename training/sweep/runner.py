"""The study loop shared by `mlops sweep run` (the coordinator) and `mlops sweep worker` (any number more).

`sweep run` validates the plan, checks storage and tracking, opens the parent run, runs the training smoke
check once, then puts `n_trials` trials in the study's queue (Optuna WAITING trials) and works on them. A
worker claims queued trials one at a time (an atomic WAITING -> RUNNING update in the storage), so every
trial runs exactly once and the study holds exactly the trials asked for, however many workers join. The
coordinator waits for the other workers' trials, then logs the results to the parent run.
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlops.errors import MLOpsError, NotFoundError
from mlops.lineage import Tag
from training.sweep import storage as st
from training.sweep.plan import PLAN_ATTR, SweepPlan
from training.sweep.trial import RUN_ATTR, Context, Outcome, run_trial

PARENT_ATTR = "mlops.parent_run_id"
EXPERIMENT_ATTR = "mlops.experiment"
SMOKE_ATTR = "mlops.smoke"
TRACKING_ATTR = "mlops.tracking_uri"


@dataclass
class SweepSummary:
    study: str
    storage: str
    parent_run_id: str | None
    outcomes: list[Outcome] = field(default_factory=list)
    best: dict | None = None
    registered: str | None = None


def mlflow_tracker(experiment: str, run_name: str | None, tags: dict, parent_run_id: str | None):
    from mlops.tracking import MlflowTracker

    return MlflowTracker.start(experiment, run_name=run_name, tags=tags, parent_run_id=parent_run_id,
                               attach_env_run=parent_run_id is None)


# --------------------------------------------------------------------------- storage and study


class StaleTrialHandler:
    """Runs for each trial whose worker stopped beating: its MLflow run becomes FAILED with the reason, and
    with sweep.retry_failed > 0 the trial is queued again (the retry resumes its checkpoints)."""

    def __init__(self, retries: int = 0) -> None:
        self.retries = retries

    def __call__(self, study, frozen) -> None:
        from mlops.tracking import MlflowTracker

        run_id = frozen.user_attrs.get(RUN_ATTR)
        reason = (f"worker stopped sending heartbeats (killed or lost) while running trial {frozen.number}; "
                  "marked failed by the heartbeat check")
        if run_id:
            try:
                tracker = MlflowTracker.start("unused", resume_run_id=run_id, attach_env_run=False)
                tracker.set_tags({Tag.SWEEP_TRIAL_STATE: "FAIL"})
                tracker.close("FAILED", reason=reason)
            except Exception as err:  # noqa: BLE001 - the study's verdict stands even if MLflow is away
                print(f"warning: could not mark MLflow run {run_id} failed: {err}")
        if self.retries:
            import optuna

            optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=self.retries)(study, frozen)


def open_study_storage(url: str, plan: SweepPlan | None = None):
    interval = plan.sweep.heartbeat_interval if plan else None
    grace = plan.sweep.grace_period if plan else None
    retries = plan.sweep.retry_failed if plan else 0
    return st.open_storage(url, heartbeat_interval=interval, grace_period=grace,
                           on_stale=StaleTrialHandler(retries) if plan else None)


def load_study(storage, name: str, plan: SweepPlan | None = None, *, seed: int | None = None):
    import optuna

    from training.sweep.pruners import make_sampler

    if name not in st.study_names(storage):
        raise NotFoundError(
            f"there is no study '{name}' in {st.display_url(storage.url)}. "
            f"Fix: start it with `mlops sweep run --config <sweep.yaml> --storage <url>`, or pick one of: "
            f"{', '.join(st.study_names(storage)) or '(none)'}."
        )
    if plan is None:
        return optuna.load_study(study_name=name, storage=storage)
    return optuna.load_study(study_name=name, storage=storage, pruner=plan.pruner(),
                             sampler=make_sampler(plan.sweep.sampler, seed))


def stored_plan(study) -> SweepPlan:
    attrs = study.user_attrs
    if PLAN_ATTR not in attrs:
        raise MLOpsError(f"study '{study.study_name}' was not created by `mlops sweep run` (no plan stored). "
                         "Fix: start sweeps with `mlops sweep run`.")
    return SweepPlan.from_attrs(attrs[PLAN_ATTR])


def worker_seed(seed: int) -> int:
    """Each extra worker samples with its own stream; the coordinator keeps the configured seed."""
    return (seed + zlib.crc32(f"{socket.gethostname()}:{os.getpid()}".encode())) % 2**31


# --------------------------------------------------------------------------- the queue


def claim(study, storage):
    """Atomically take one queued (WAITING) trial: (trial, trial id, first trial of its retry chain), or None
    when the queue is empty."""
    import optuna

    study_id = storage.get_study_id_from_name(study.study_name)
    waiting = storage.get_all_trials(study_id, deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    for frozen in waiting:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        try:
            if not storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.RUNNING):
                continue  # another worker was faster
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        history = frozen.system_attrs.get("retry_history") or []  # set by the stale-trial retry callback
        return optuna.Trial(study, trial_id), trial_id, (int(history[0]) if history else frozen.number)
    return None


def enqueue(study, n: int, fixed: list[dict] = ()) -> int:
    """Queue `n` trials: the fixed-param ones first (each once per study), then free ones for the sampler."""
    import warnings

    before = len(study.get_trials(deepcopy=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for params in list(fixed)[:n]:
            study.enqueue_trial(dict(params), skip_if_exists=True)
        added = len(study.get_trials(deepcopy=False)) - before
        for _ in range(n - added):
            study.enqueue_trial({}, skip_if_exists=False)
    return n


def work(ctx: Context, storage, *, max_trials: int | None = None) -> list[Outcome]:
    """Claim and run queued trials until the queue is empty (or `max_trials` ran)."""
    outcomes: list[Outcome] = []
    while max_trials is None or len(outcomes) < max_trials:
        st.fail_stale(ctx.study)
        claimed = claim(ctx.study, storage)
        if claimed is None:
            break
        trial, trial_id, root = claimed
        with st.Heartbeat(storage, trial_id, ctx.plan.sweep.heartbeat_interval):
            outcomes.append(run_trial(ctx, trial, root))
    return outcomes


def wait_for_others(ctx: Context, storage, *, poll_s: float = 2.0, log: Callable[[str], None] = print) -> list:
    """Until no trial is queued or running: runs requeued trials itself, lets heartbeats fail dead ones."""
    import optuna

    TS = optuna.trial.TrialState
    outcomes: list[Outcome] = []
    announced = False
    while True:
        st.fail_stale(ctx.study)
        open_trials = ctx.study.get_trials(deepcopy=False, states=(TS.WAITING, TS.RUNNING))
        if not open_trials:
            return outcomes
        if any(t.state == TS.WAITING for t in open_trials):
            outcomes += work(ctx, storage)
            continue
        if not announced:
            log(f"waiting for {len(open_trials)} trial(s) running on other workers")
            announced = True
        time.sleep(poll_s)


def context(plan: SweepPlan, study, trainer, *, parent_run_id: str | None, experiment: str,
            start_tracker=None, log: Callable[[str], None] = print) -> Context:
    return Context(plan, study, parent_run_id, experiment, trainer, start_tracker or mlflow_tracker, log)


def default_trainer():
    from training.sweep.objective import StageTrainer

    return StageTrainer()


def study_info(study) -> dict[str, Any]:
    attrs = study.user_attrs
    return {"parent_run_id": attrs.get(PARENT_ATTR), "experiment": attrs.get(EXPERIMENT_ATTR),
            "tracking_uri": attrs.get(TRACKING_ATTR), "smoke": attrs.get(SMOKE_ATTR)}
