"""Metering: device-hours per job, and their sums per team, user, model and month (`mlops usage`).

A job's device-hours are Ray Train's own span of its run (start to end, every restart after a lost worker
included, none of the time it waited for its turn) times its devices. The job's driver writes them on its MLflow
run when it ends (metrics `device_hours`, `job_wall_s`, `job_devices`, `job_restarts`; tags team, user, job,
month), so usage outlives the cluster; jobs still training are read live from the cluster. Quotas are charged
with these figures, not with the plan.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass

from mlops.lineage import Tag

MONTH_TAG = "mlops.usage_month"  # the UTC month a job's hours are charged to (the month its training started)
METRICS = ("device_hours", "job_wall_s", "job_devices", "job_restarts")


@dataclass
class UsageRow:
    job_id: str
    team: str
    user: str
    model: str
    month: str
    devices: int
    device_hours: float
    state: str  # ENDED (metered on its run) or TRAINING (live, so far)
    run_id: str | None = None
    restarts: int = 0


def metered_rows() -> list[UsageRow]:
    """Every metered job, from the MLflow runs of the training service (any experiment, any team)."""
    from mlops.run_store import find_runs

    rows = []
    for run in find_runs({}, status=None, having=(Tag.JOB_ID,), max_results=50_000):
        tags, metrics = run.data.tags, run.data.metrics
        if "device_hours" not in metrics:
            continue
        rows.append(UsageRow(tags[Tag.JOB_ID], tags.get(Tag.TEAM, "?"), tags.get(Tag.SUBMITTED_BY, "?"),
                             tags.get(Tag.BASE_MODEL, "?"), tags.get(MONTH_TAG, "?"),
                             int(metrics.get("job_devices", 0)), float(metrics["device_hours"]), "ENDED",
                             run.info.run_id, int(metrics.get("job_restarts", 0))))
    return rows


def live_rows(jobs, metered: set[str], now: float | None = None) -> list[UsageRow]:
    """Jobs the cluster is training now (or that ended without metering themselves): their hours so far."""
    from training.queue_rules import device_hours, month_of

    now = now or time.time()
    rows = []
    for job in jobs:
        if job.job_id in metered or job.started is None:
            continue
        rows.append(UsageRow(job.job_id, job.team, job.user, job.model, month_of(job.started), job.devices,
                             device_hours(job.devices, job.started, job.ended, now),
                             "TRAINING" if job.ended is None else "ENDED"))
    return rows


def all_rows(jobs=None) -> list[UsageRow]:
    rows = metered_rows()
    return rows + live_rows(jobs or [], {r.job_id for r in rows})


def select(rows: list[UsageRow], *, team: str | None = None, month: str | None = None) -> list[UsageRow]:
    return [r for r in rows if (team is None or r.team == team) and (month is None or r.month == month)]


def summarize(rows: list[UsageRow]) -> list[dict]:
    """Device-hours and jobs per (team, user, model, month), largest first."""
    sums: dict[tuple, dict] = defaultdict(lambda: {"device_hours": 0.0, "jobs": 0})
    for r in rows:
        cell = sums[(r.team, r.user, r.model, r.month)]
        cell["device_hours"] += r.device_hours
        cell["jobs"] += 1
    out = [{"team": k[0], "user": k[1], "model": k[2], "month": k[3], **v} for k, v in sums.items()]
    return sorted(out, key=lambda d: (-d["device_hours"], d["team"], d["user"]))


def as_json(rows: list[UsageRow]) -> dict:
    return {"jobs": [asdict(r) for r in rows], "totals": summarize(rows)}


def describe(rows: list[UsageRow]) -> str:
    totals = summarize(rows)
    if not totals:
        return "no metered training jobs"
    head = f"{'team':<16} {'user':<12} {'model':<24} {'month':<8} {'jobs':>5} {'device-h':>10}"
    lines = [head] + [f"{t['team']:<16} {t['user']:<12} {t['model'][:24]:<24} {t['month']:<8} {t['jobs']:>5} "
                      f"{t['device_hours']:>10.4f}" for t in totals]
    return "\n".join(lines)


def prometheus_text(rows: list[UsageRow]) -> str:
    """Gauges for node_exporter's textfile collector: device-hours per team, user, model and month."""
    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")

    totals = summarize(rows)
    labels = [",".join(f'{k}="{esc(str(t[k]))}"' for k in ("team", "user", "model", "month")) for t in totals]
    lines = ["# HELP mlops_training_device_hours Device-hours of training jobs (wall x devices, retries included).",
             "# TYPE mlops_training_device_hours gauge"]
    lines += [f"mlops_training_device_hours{{{lab}}} {t['device_hours']:.6f}" for lab, t in zip(labels, totals, strict=True)]
    lines += ["# HELP mlops_training_jobs Training jobs metered.", "# TYPE mlops_training_jobs gauge"]
    lines += [f"mlops_training_jobs{{{lab}}} {t['jobs']}" for lab, t in zip(labels, totals, strict=True)]
    return "\n".join(lines) + "\n"
