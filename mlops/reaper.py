"""Runs left RUNNING by a process that died (SIGKILL, OOM, a lost node) are marked KILLED with a reason.

A run belongs to the process named by its `mlops.host`/`mlops.pid`/`mlops.process_start` tags. On this host a
run is dead when that process no longer exists (or the pid was reused by a younger process). On any host a run
whose `mlops.heartbeat` is older than `stale_after` seconds is dead too: long runs beat, so a silent one is gone.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from mlops.lineage import Tag


@dataclass(frozen=True)
class Reaped:
    run_id: str
    experiment_id: str
    reason: str


def process_alive(pid: int, started: float | None) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def death_reason(tags: dict[str, str], host: str, now: float, stale_after: float | None) -> str | None:
    """Why a RUNNING run with these tags is dead, or None when it may still be alive."""
    beat = tags.get(Tag.HEARTBEAT)
    if stale_after and beat:
        try:
            age = now - float(beat)
        except ValueError:
            age = 0.0
        if age > stale_after:
            return f"no heartbeat for {age:.0f} s (limit {stale_after:.0f} s) from {tags.get(Tag.HOST, '?')}"
    if tags.get(Tag.HOST) != host or not tags.get(Tag.PID):
        return None
    try:
        pid = int(tags[Tag.PID])
        started = float(tags[Tag.PROCESS_START]) if tags.get(Tag.PROCESS_START) else None
    except ValueError:
        return None
    if process_alive(pid, started):
        return None
    return f"its process {pid} on {host} is gone"


def reap(*, stale_after: float | None = 600.0, dry_run: bool = False) -> list[Reaped]:
    """Mark this store's dead RUNNING runs KILLED; returns what was (or, dry, would be) reaped."""
    from mlops.tracking import call, client, mark_killed

    c = client()
    experiments = [e.experiment_id for e in call("experiments", c.search_experiments)]
    if not experiments:
        return []
    running = call("running runs", lambda: c.search_runs(experiments, "attributes.status = 'RUNNING'",
                                                         max_results=5000))
    host, now, out = socket.gethostname(), time.time(), []
    for run in running:
        reason = death_reason(run.data.tags, host, now, stale_after)
        if reason is None:
            continue
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        full = f"reaped at {stamp}: {reason}; the run cannot finish (resume it by rerunning the same command)"
        if not dry_run:
            mark_killed(run.info.run_id, full)
        out.append(Reaped(run.info.run_id, run.info.experiment_id, full))
    return out
