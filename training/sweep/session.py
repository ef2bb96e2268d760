"""The sweep stage's core functions: `run_sweep` (coordinator), `run_worker` (join a study), `study_status`.

Every check runs before the first trial: the plan (space, pruner, sampler, objective), the storage, the
tracking store, an existing study's plan, the snapshot, and finally the training smoke check.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path

from mlops.errors import ConfigError, MLOpsError
from mlops.lineage import Tag
from training.sweep import runner as rn
from training.sweep import storage as st
from training.sweep.plan import PLAN_ATTR, SweepPlan, build_plan


def _experiment_of(tracker, default: str) -> str:
    """Under `mlflow run` the parent is the run MLflow made, in the experiment it chose: trials go there too."""
    client = getattr(tracker, "client", None)
    if client is None:
        return default
    return client.get_experiment(client.get_run(tracker.run_id).info.experiment_id).name


def _pin_snapshot(plan: SweepPlan) -> None:
    """`train.snapshot: latest` is resolved once, so a snapshot built mid-sweep cannot change later trials."""
    from training.data_loader import resolve_snapshot_id

    train = plan.base.setdefault("train", {})
    train["snapshot"] = resolve_snapshot_id(train.get("snapshot"))


def _check_resume(store, plan: SweepPlan) -> dict | None:
    """The stored plan of an existing study, after checking this sweep is the same study."""
    if plan.study not in st.study_names(store):
        return None
    study = rn.load_study(store, plan.study)
    stored = study.user_attrs.get(PLAN_ATTR)
    if stored and stored.get("plan_hash") != plan.plan_hash:
        raise ConfigError(
            f"study '{plan.study}' in {st.display_url(store.url)} was created by a different sweep (its space, "
            "objective, direction, pruner, sampler, base config or its snapshot differ). Fix: pass --study <new name> for a "
            "new study, or resume it with the config it was created with."
        )
    return study.user_attrs


def _parent_tags(plan: SweepPlan, url: str) -> dict:
    from mlops.lineage import collect_lineage

    lineage = collect_lineage(plan.plan_hash, plan.seed, base_model=plan.base.get("base_model"),
                              snapshot_id=plan.base.get("train", {}).get("snapshot"),
                              extra={Tag.STAGE: "sweep", Tag.SWEEP_STUDY: plan.study,
                                     Tag.SWEEP_STORAGE: st.display_url(url)})
    return lineage.as_tags()


def _smoke(plan: SweepPlan, trainer, start_tracker, parent_run_id: str, experiment: str, log) -> dict:
    """The training stage's smoke check on the base config, as a nested run; raises when it does not train."""
    import shutil

    from mlops.config import validate_config
    from training.sweep.trial import trial_dir

    data = copy.deepcopy(plan.base)
    data.setdefault("run", {}).update({"experiment": experiment, "run_name": f"{plan.study}-smoke"})
    folder = trial_dir(plan, 0).with_name("smoke")
    data["train"].setdefault("checkpoint", {})["dir"] = str(folder / "checkpoints")
    cfg = validate_config(data, source="the base train config")
    tracker = start_tracker(experiment, cfg.run.run_name, {Tag.SWEEP_STUDY: plan.study}, parent_run_id)
    log(f"smoke check of the base config (run {tracker.run_id}) ...")
    try:
        result = trainer.smoke(cfg, tracker)
    except MLOpsError as err:
        raise MLOpsError(f"the sweep's base config does not train, so study '{plan.study}' was not started: "
                         f"{err}") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    metrics = dict(getattr(result, "metrics", {}) or {})
    obj = plan.objective
    if obj.source == "trainer" and obj.metric not in metrics:
        raise ConfigError(
            f"sweep.objective='{obj.metric}' is not produced by the trainer for this base config (its smoke run "
            f"reported {', '.join(sorted(metrics))}). Fix: choose one of those, or give the snapshot a "
            "validation split for val_loss."
        )
    return {"base_hash": plan.base_hash, "run_id": tracker.run_id, "metrics": sorted(metrics)}


def registering_identity():
    """Registering the best trial is a governed act: the registry's identity (MLOPS_USER / MLOPS_PASSWORD)."""
    from mlops.identities import from_env

    return from_env("register")


def run_sweep(config: Path | str | None, overrides: list[str] = (), *, study: str | None = None,
              n_trials: int | None = None, storage: str | None = None, register: bool | None = None,
              trainer=None, start_tracker=None, log: Callable[[str], None] = print) -> rn.SweepSummary:
    """Validate, smoke-check, then run `n_trials` trials of the study (more workers may join) and log results."""
    plan = build_plan(config, list(overrides), study=study, n_trials=n_trials, storage=storage)
    url = st.resolve_url(None, plan.sweep.storage)
    st.check_reachable(url)
    if start_tracker is None:
        from mlops.tracking import check_tracking_uri, tracking_uri

        check_tracking_uri(tracking_uri())
    registering = plan.sweep.register_best if register is None else register
    registrar = registering_identity() if registering else None  # refused before any trial runs, not after all of them
    _pin_snapshot(plan)
    store = rn.open_study_storage(url, plan)
    previous = _check_resume(store, plan) or {}
    trainer = trainer or rn.default_trainer()
    start_tracker = start_tracker or rn.mlflow_tracker
    parent = start_tracker(plan.experiment, plan.study, _parent_tags(plan, url), None)
    summary = rn.SweepSummary(plan.study, st.display_url(url), parent.run_id)
    try:
        experiment = _experiment_of(parent, plan.experiment)
        parent.log_params({"sweep.study": plan.study, "sweep.space": plan.sweep.space,
                           "sweep.objective": plan.objective.metric, "sweep.direction": plan.sweep.direction,
                           "sweep.pruner": plan.sweep.pruner.name, "sweep.sampler": plan.sweep.sampler,
                           "sweep.n_trials": plan.sweep.n_trials})
        parent.log_dict(plan.to_attrs(), "sweep/plan.json")
        smoke = previous.get(rn.SMOKE_ATTR)
        if not smoke or smoke.get("base_hash") != plan.base_hash:
            smoke = _smoke(plan, trainer, start_tracker, parent.run_id, experiment, log)
        else:
            log(f"smoke check passed before for this base config (run {smoke['run_id']})")
        summary.outcomes = _optimize(plan, store, url, trainer, start_tracker, parent.run_id, experiment, smoke, log)
        from training.sweep import results

        done = rn.load_study(store, plan.study)
        summary.best = results.log_results(parent, done, plan)
        if registering:
            reg = results.register_best(done, registrar, name=plan.sweep.register_name or plan.study)
            summary.registered = f"models:/{reg['registered_model']}/{reg['version']}"
            parent.set_tags({Tag.MODEL_REF: summary.registered})
    except BaseException as err:
        reason = str(err) if isinstance(err, MLOpsError) else f"{type(err).__name__}: {err}"
        parent.close("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED", reason=reason[:4000])
        raise
    parent.close("FINISHED")
    return summary


def _optimize(plan, store, url, trainer, start_tracker, parent_run_id, experiment, smoke, log) -> list:
    import optuna

    from mlops.tracking import tracking_uri
    from training.sweep.pruners import make_sampler

    study = optuna.create_study(study_name=plan.study, storage=store, direction=plan.sweep.direction,
                                pruner=plan.pruner(), sampler=make_sampler(plan.sweep.sampler, plan.seed),
                                load_if_exists=True)
    for key, value in {PLAN_ATTR: plan.to_attrs(), rn.PARENT_ATTR: parent_run_id, rn.EXPERIMENT_ATTR: experiment,
                       rn.SMOKE_ATTR: smoke, rn.TRACKING_ATTR: st.display_url(tracking_uri())}.items():
        study.set_user_attr(key, value)
    rn.enqueue(study, plan.sweep.n_trials, plan.sweep.enqueue)
    log(f"study '{plan.study}' on {st.display_url(url)}: {plan.sweep.n_trials} trial(s) queued; more workers can "
        f"join with `mlops sweep worker --study {plan.study} --storage {st.display_url(url)}`")
    ctx = rn.context(plan, study, trainer, parent_run_id=parent_run_id, experiment=experiment,
                     start_tracker=start_tracker, log=log)
    outcomes = rn.work(ctx, store)
    return outcomes + rn.wait_for_others(ctx, store, log=log)


def _find_study(probe, name: str, wait_s: float):
    deadline = time.monotonic() + wait_s
    while True:
        try:
            study = rn.load_study(probe, name)
            if PLAN_ATTR in study.user_attrs and (
                    study.get_trials(deepcopy=False) or time.monotonic() >= deadline):
                return study
        except MLOpsError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(1.0)


def run_worker(study: str, storage: str | None = None, *, wait_s: float = 0.0, max_trials: int | None = None,
               trainer=None, start_tracker=None, log: Callable[[str], None] = print) -> rn.SweepSummary:
    """Join a study started by `sweep run` and work its queued trials until none is left."""
    url = st.resolve_url(storage)
    st.check_reachable(url)
    if start_tracker is None:
        from mlops.tracking import check_tracking_uri, tracking_uri

        check_tracking_uri(tracking_uri())
    probe = rn.open_study_storage(url)
    found = _find_study(probe, study, wait_s)
    plan = rn.stored_plan(found)
    info = rn.study_info(found)
    _pin_snapshot(plan)  # this machine must hold the study's snapshot: fail now, not in every trial
    if start_tracker is None:
        from mlops.tracking import tracking_uri

        recorded = info.get("tracking_uri")
        if recorded and recorded != st.display_url(tracking_uri()):
            log(f"warning: this worker tracks to {st.display_url(tracking_uri())} but the study's parent run is in "
                f"{recorded}; set MLFLOW_TRACKING_URI to the same store so trials nest under it")
    store = rn.open_study_storage(url, plan)
    live = rn.load_study(store, study, plan, seed=rn.worker_seed(plan.seed))
    trainer = trainer or rn.default_trainer()
    ctx = rn.context(plan, live, trainer, parent_run_id=info["parent_run_id"], experiment=info["experiment"],
                     start_tracker=start_tracker, log=log)
    summary = rn.SweepSummary(study, st.display_url(url), info["parent_run_id"])
    summary.outcomes = rn.work(ctx, store, max_trials=max_trials)
    return summary


def study_status(study: str, storage: str | None = None) -> dict:
    """Counts, best trial and the trial table; fails trials whose worker stopped beating first."""
    from training.sweep import results

    url = st.resolve_url(storage)
    st.check_reachable(url)
    probe = rn.open_study_storage(url)
    found = rn.load_study(probe, study)
    plan = rn.stored_plan(found) if PLAN_ATTR in found.user_attrs else None
    live = rn.load_study(rn.open_study_storage(url, plan), study) if plan else found
    if plan:
        st.fail_stale(live)
    return {"study": study, "storage": st.display_url(url), **rn.study_info(live),
            "counts": results.counts(live), "trials": results.trial_rows(live)}
