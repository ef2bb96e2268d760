"""The training service's rules, pure: which waiting job starts next, when each may start, how much of a team's
monthly quota is left, and what a job costs. No Ray, no MLflow: `training.ray_jobs` reads the cluster's job table
(Ray's own, the only queue) and hands these functions plain `Job` records; the CLI, the job driver and the tests
all ask the same functions.

Order: waiting jobs start by priority (high, normal, low), then by submission time. A team at its
`max_concurrent` is skipped, not waited on, so one busy team never blocks another; but the first job that may
start must start first (no smaller job jumps it for free devices), so a large job is never starved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from registry.config import PRIORITIES

WAITING, TRAINING = "WAITING", "TRAINING"
LIVE = (WAITING, TRAINING)  # jobs that hold or will hold devices
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass
class Job:
    job_id: str
    team: str
    user: str
    priority: str
    state: str  # WAITING (queued, not yet training), TRAINING, or one of ENDED
    submitted: float  # epoch seconds
    devices: int
    planned_hours: float  # device-hours the plan gave, with its margin
    model: str = ""
    started: float | None = None  # when Ray started the job (its driver); metering counts from here
    ended: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def planned_wall_s(self) -> float:
        return self.planned_hours * 3600 / max(1, self.devices)


def rank(job: Job) -> tuple[int, float, str]:
    return PRIORITIES.index(job.priority), job.submitted, job.job_id


def queue_order(jobs: list[Job]) -> list[Job]:
    """Waiting jobs in the order they are to start."""
    return sorted((j for j in jobs if j.state == WAITING), key=rank)


def training_count(jobs: list[Job], team: str) -> int:
    return sum(1 for j in jobs if j.team == team and j.state == TRAINING)


def next_to_start(jobs: list[Job], limits: dict[str, int]) -> Job | None:
    """The waiting job whose turn it is: the first in queue order whose team is below its concurrency limit."""
    for job in queue_order(jobs):
        if training_count(jobs, job.team) < limits.get(job.team, 1):
            return job
    return None


def may_start(job_id: str, jobs: list[Job], limits: dict[str, int], free_devices: float) -> tuple[bool, str]:
    """(ok, reason) for a waiting job to start training now."""
    mine = next((j for j in jobs if j.job_id == job_id), None)
    if mine is None:
        return False, f"job {job_id} is not in the cluster's job table"
    if training_count(jobs, mine.team) >= limits.get(mine.team, 1):
        return False, f"team {mine.team} runs {limits.get(mine.team, 1)} job(s), its max_concurrent"
    turn = next_to_start(jobs, limits)
    if turn is not None and turn.job_id != job_id:
        return False, f"job {turn.job_id} ({turn.team}, {turn.priority}) starts first"
    if free_devices < mine.devices:
        return False, f"{free_devices:g} of the {mine.devices} devices it needs are free"
    return True, "its turn, and its devices are free"


def estimate_starts(jobs: list[Job], limits: dict[str, int], capacity: int, now: float) -> dict[str, float]:
    """When each waiting job is expected to start (epoch seconds), replaying the queue rule over the planned
    wall times of the jobs ahead of it. An estimate for `mlops train queue`, never a decision."""
    ends: list[tuple[float, Job]] = [(max(now, (j.started or now) + j.planned_wall_s), j)
                                     for j in jobs if j.state == TRAINING]
    running = [j for j in jobs if j.state == TRAINING]
    waiting = queue_order(jobs)
    clock, starts = now, {}
    while waiting:
        free = capacity - sum(j.devices for j in running)
        pick = next((j for j in waiting if training_count(running, j.team) < limits.get(j.team, 1)), None)
        if pick is not None and pick.devices <= free:
            starts[pick.job_id] = clock
            started = Job(**{**pick.__dict__, "state": TRAINING, "started": clock})
            running.append(started)
            ends.append((clock + pick.planned_wall_s, started))
            waiting.remove(pick)
            continue
        if not ends:  # nothing will ever free devices: it cannot fit the cluster
            break
        ends.sort(key=lambda e: e[0])
        clock, done = ends.pop(0)
        clock = max(clock, now)
        running = [j for j in running if j.job_id != done.job_id]
    return starts


def month_of(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m")


def device_hours(devices: int, started: float | None, ended: float | None, now: float) -> float:
    """Wall time from Ray's own start to end (retries included, since a restart is inside the job) x devices."""
    if started is None:
        return 0.0
    return max(0.0, (ended or now) - started) * devices / 3600


@dataclass
class QuotaView:
    team: str
    month: str
    quota: float
    metered: float  # device-hours of this month's jobs, as Ray timed them
    reserved: float  # planned device-hours of live jobs not yet metered in full

    @property
    def left(self) -> float:
        return self.quota - self.metered - self.reserved


def quota_view(team: str, quota: float, month: str, metered_by_job: dict[str, float], live: list[Job],
               now: float) -> QuotaView:
    """What is left of a team's monthly quota: the quota less every metered job of the month, less what its live
    jobs may still use (their plan, less what they already metered)."""
    metered = sum(metered_by_job.values())
    reserved = 0.0
    for job in live:
        if job.team != team or job.state not in LIVE:
            continue
        used = device_hours(job.devices, job.started, None, now)
        if job.job_id not in metered_by_job:
            metered += used
        reserved += max(0.0, job.planned_hours - used)
    return QuotaView(team, month, quota, metered, reserved)

