"""`mlops train submit`: admit a training job and hand it to the Ray cluster's job table, or refuse it first.

Every check runs before anything is written (no run, no folder, no job): the submitter's identity, the team
(in the signed policy) and its membership, the fences between teams (snapshot, base model, checkpoint folder),
the plan (the same `plan_job` as `mlops train plan`: it must fit the device, and the cluster must hold the
job's workers), and the team's monthly quota, which the planned device-hours (with the plan's margin) must fit
after what the team metered this month and what its live jobs may still use. Admitted, the job is a Ray job:
its driver (`mlops train job`, training.ray_job) waits for its turn there, then trains with Ray Train.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from mlops.errors import ConfigError, MLOpsError, did_you_mean
from mlops.identities import AuthError

SPEC_ENV = "MLOPS_JOB_SPEC"
# Never sent with a job: the job table shows its environment to everyone who can read the cluster.
SECRET_MARKERS = ("PASSWORD", "SECRET", "TOKEN", "MLOPS_USER")
# Nor the run of an `mlflow run -e submit` wrapper: the job opens its own run, which must not log into the wrapper's.
NOT_FORWARDED = ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLOPS_TRAIN_RUN_ID")


class QuotaExceeded(MLOpsError):
    exit_code = 3


@dataclass
class Submission:
    job_id: str
    team: str
    user: str
    priority: str
    devices: int
    planned_hours: float
    quota_left: float
    address: str
    experiment: str
    ckpt_dir: str


def teams_in_force() -> dict:
    """The teams of the signed release policy (the verified ledger's newest `policy` entry)."""
    from registry.resolve import present, release_policy

    if not present():
        raise ConfigError("there is no registry on this store, so there are no teams: teams and quotas live in the "
                          "signed release policy. Fix: bootstrap the registry (`mlops registry bootstrap`) and have "
                          "an admin record registry.teams with `mlops registry policy set`.")
    return release_policy().teams


def team_of(teams: dict, team: str, who) -> object:
    if team not in teams:
        raise ConfigError(f"unknown team '{team}': {did_you_mean(team, teams) if teams else 'the policy names no '}"
                          f"{'' if teams else 'team'}. Nothing was queued. Fix: pass one of the policy's teams, or "
                          "ask an admin to add it under registry.teams (`mlops registry policy set`).")
    policy = teams[team]
    if who.name not in policy.members and who.role != "admin":
        raise AuthError(f"user '{who.name}' is not a member of team {team} (members: {', '.join(policy.members)}). "
                        "Nothing was queued. Fix: submit for your own team, or ask an admin to add you to "
                        f"registry.teams.{team}.members.")
    return policy


def plan_for_cluster(cfg) -> dict:
    """The job's plan on the cluster's devices; ConfigError (with the planner's fixes) when it does not fit."""
    from training import hardware
    from training.planner import plan_job

    c = cfg.train.cluster
    try:
        hw = hardware.named(c.hardware)
    except MLOpsError as err:
        raise ConfigError(f"train.cluster.hardware={c.hardware}: {err}") from None
    plan = plan_job(cfg, hw=hw, gpus=c.workers)
    if not plan["fits"] and not cfg.train.allow_unfit:
        fixes = "; ".join(" ".join(f["overrides"]) for f in plan.get("fixes", [])[:3] if f.get("overrides"))
        gib = 2**30
        raise ConfigError(f"the plan refuses this job: {plan['memory_total_bytes'] / gib:.1f} GiB per worker on "
                          f"{c.hardware}, {plan['memory_limit_bytes'] / gib:.1f} GiB usable. Nothing was queued. "
                          f"Fix: {fixes or 'lower train.micro_batch_size or raise train.zero_stage'} (see `mlops "
                          "train plan`), or set train.allow_unfit=true.")
    return plan


def planned_hours(plan: dict, devices: int) -> float:
    return float(plan["wall_time_with_margin_s"]) * devices / 3600


def submit(cfg, *, team: str, priority: str | None = None) -> Submission:
    """Admit and queue a job; MLOpsError naming the fix, before anything is written, otherwise."""
    from mlops.config import config_hash, require_section
    from mlops.identities import from_env
    from mlops.tenancy import team_experiment
    from registry.config import PRIORITIES
    from training.tenants import (
        check_base_model,
        check_ckpt_dir,
        scope_snapshot,
        snapshot_root,
        team_ckpt_root,
    )

    t = require_section(cfg, "train")
    who = from_env("train")
    teams = teams_in_force()
    policy = team_of(teams, team, who)
    priority = priority or policy.default_priority
    if priority not in PRIORITIES:
        raise ConfigError(f"--priority {priority} is not one of {', '.join(PRIORITIES)}. Fix: pass one of them.")
    t.snapshot, root = scope_snapshot(t.snapshot, team, teams)
    check_base_model(cfg.base_model, team, teams)
    ckpt_root = team_ckpt_root(team, t.cluster.storage_path)
    check_ckpt_dir(t.checkpoint.dir, team, ckpt_root)
    with snapshot_root(root):
        plan = plan_for_cluster(cfg)
    devices = t.cluster.workers
    hours = planned_hours(plan, devices)
    _quota(team, policy, [], hours)  # what is metered already: refused before the cluster is even asked
    address, jobs_client, jobs = _cluster(t.cluster, devices)
    view = _quota(team, policy, jobs, hours)
    cfg.run.experiment = team_experiment(team, cfg.run.experiment)
    t.checkpoint.dir = t.checkpoint.dir or str(ckpt_root / config_hash(cfg)[:16])
    job_id = f"train-{team}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    spec = {"job_id": job_id, "team": team, "user": who.name, "priority": priority, "devices": devices,
            "planned_hours": hours, "address": address, "config": cfg.model_dump(mode="json"),
            "storage_path": str(ckpt_root / "ray")}
    meta = {"kind": "mlops-train", "team": team, "user": who.name, "priority": priority, "submitted": f"{time.time()}",
            "devices": str(devices), "planned_hours": f"{hours:.6f}", "model": str(cfg.base_model),
            "max_concurrent": str(policy.max_concurrent), "experiment": cfg.run.experiment}
    jobs_client.submit_job(entrypoint=f"{sys.executable} -m mlops train job", submission_id=job_id, metadata=meta,
                           runtime_env={"env_vars": job_env(spec, root, t.cluster)}, entrypoint_num_cpus=0)
    return Submission(job_id, team, who.name, priority, devices, hours, view.left - hours, address,
                      cfg.run.experiment, t.checkpoint.dir)


def _cluster(c, devices: int):
    from training.ray_jobs import client, cluster_address, service_jobs
    from training.ray_jobs import devices as cluster_devices

    address = cluster_address(c.address)
    jobs_client = client(address)
    capacity = cluster_devices(address, c.use_gpu, c.cpus_per_worker)
    if capacity < devices:
        kind = "GPUs" if c.use_gpu else f"workers of {c.cpus_per_worker:g} CPU"
        raise ConfigError(f"the job needs {devices} {kind}, and the cluster at {address} holds {capacity} in all. "
                          f"Nothing was queued. Fix: set train.cluster.workers={max(1, capacity)} or fewer (with "
                          "train.global_batch_size to keep the batch), or add nodes (`ray start --address=HEAD`).")
    return address, jobs_client, service_jobs(address, jobs_client)


def _quota(team: str, policy, jobs, hours: float):
    from training.queue_rules import month_of, quota_view
    from training.usage import metered_rows, select

    now = time.time()
    month = month_of(now)
    metered = {r.job_id: r.device_hours for r in select(metered_rows(), team=team, month=month)}
    view = quota_view(team, policy.quota_device_hours, month, metered, jobs, now)
    if hours > view.left:
        raise QuotaExceeded(
            f"team {team} has {max(0.0, view.left):.4f} of its {view.quota:g} device-hours left in {month} "
            f"({view.metered:.4f} metered, {view.reserved:.4f} held by its live jobs), and this job plans "
            f"{hours:.4f} (with the plan's margin). Nothing was queued. Fix: shorten the job (train.max_steps, "
            f"fewer workers), wait for next month, or ask an admin to raise registry.teams.{team}."
            "quota_device_hours.")
    return view


def job_env(spec: dict, snapshot_root: Path, c) -> dict[str, str]:
    """The job's environment: the submitter's store and offline settings, never a secret."""
    from mlops.paths import HOME_ENV, SNAPSHOTS_ENV, project_home
    from mlops.tracking import tracking_uri

    env = {k: v for k, v in os.environ.items() if k.startswith(("MLOPS_", "HF_", "MLFLOW_", "TRANSFORMERS_"))
           and not any(m in k for m in SECRET_MARKERS) and k not in NOT_FORWARDED}
    env.update({SPEC_ENV: json.dumps(spec), HOME_ENV: str(project_home()), "MLFLOW_TRACKING_URI": tracking_uri(),
                SNAPSHOTS_ENV: str(snapshot_root), "TOKENIZERS_PARALLELISM": "false",
                "RAY_TRAIN_ENABLE_STATE_TRACKING": "1", "OMP_NUM_THREADS": str(max(1, int(c.cpus_per_worker)))})
    if not c.use_gpu:
        env["DS_ACCELERATOR"] = "cpu"
    return env
