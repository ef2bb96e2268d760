"""`mlops train queue` and `mlops train cancel`: the cluster's job table as the service's queue."""

from __future__ import annotations

import time

from mlops.errors import NotFoundError


def _address(address: str | None) -> str:
    """The cluster to read: the one named, else RAY_ADDRESS, else the local head if it runs (never started here)."""
    import os

    from training.ray_jobs import cluster_address, local_head_address

    if address or os.environ.get("RAY_ADDRESS", "").strip():
        return cluster_address(address)
    running = local_head_address()
    if running is None:
        raise NotFoundError("no Ray cluster to read: --address and RAY_ADDRESS are unset and no local head runs for "
                            "this store. Fix: pass --address http://HEAD:8265, or submit a job first (`mlops train "
                            "submit` starts the local head).")
    return running


def queue_rows(address: str | None, *, team: str | None = None, now: float | None = None) -> list[dict]:
    from training.queue_rules import TRAINING, estimate_starts, queue_order
    from training.ray_jobs import devices, service_jobs, team_limits

    address = _address(address)
    jobs = service_jobs(address)
    now = now or time.time()
    capacity = devices(address, False, 1.0) if jobs else 0
    order = {j.job_id: i + 1 for i, j in enumerate(queue_order(jobs))}
    etas = estimate_starts(jobs, team_limits(jobs), capacity, now)
    rows = []
    for job in sorted(jobs, key=lambda j: j.submitted, reverse=True):
        if team and job.team != team:
            continue
        eta = etas.get(job.job_id)
        rows.append({"job_id": job.job_id, "team": job.team, "user": job.user, "priority": job.priority,
                     "state": job.state, "devices": job.devices, "planned_hours": round(job.planned_hours, 6),
                     "position": order.get(job.job_id), "eta_s": None if eta is None else round(eta - now, 1),
                     "training_since": job.started if job.state == TRAINING else None,
                     "message": job.extra.get("message", "")})
    return rows


def render(rows: list[dict]) -> str:
    if not rows:
        return "no training jobs on this cluster"
    head = f"{'job':<40} {'team':<14} {'user':<10} {'prio':<6} {'state':<10} {'dev':>3} {'plan h':>8} {'pos':>3} eta"
    lines = [head]
    for r in rows:
        eta = "" if r["eta_s"] is None else (f"~{r['eta_s'] / 60:.1f} min" if r["eta_s"] else "now")
        lines.append(f"{r['job_id']:<40} {r['team']:<14} {r['user']:<10} {r['priority']:<6} {r['state']:<10} "
                     f"{r['devices']:>3} {r['planned_hours']:>8.4f} {r['position'] or '':>3} {eta}")
    return "\n".join(lines)


def cancel(job_id: str, address: str | None) -> str:
    """Stop a job as its submitter or an admin (AuthError otherwise)."""
    from mlops.identities import AuthError, from_env
    from training.ray_jobs import KIND, client

    who = from_env("train")
    address = _address(address)
    jobs_client = client(address)
    try:
        info = jobs_client.get_job_info(job_id)
    except Exception:  # noqa: BLE001 - Ray raises RuntimeError for an unknown id
        info = None
    if info is None or (info.metadata or {}).get("kind") != KIND:
        raise NotFoundError(f"no training job '{job_id}' on the cluster at {address}. Fix: pick an id from "
                            "`mlops train queue`.")
    owner = info.metadata.get("user")
    if who.name != owner and who.role != "admin":
        raise AuthError(f"job {job_id} was submitted by {owner}; only they or an admin may cancel it. Nothing was "
                        "changed.")
    stopped = jobs_client.stop_job(job_id)
    return (f"job {job_id} {'is stopping' if stopped else 'had already ended'}; its checkpoints stay under the "
            "team's prefix, and submitting the same config again resumes from them.")
