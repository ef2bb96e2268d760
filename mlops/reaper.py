"""Runs left RUNNING by a process that died (SIGKILL, OOM, a lost node) are marked KILLED with a reason.

A run belongs to the process named by its `mlops.host`/`mlops.pid`/`mlops.process_start` tags. On this host a
run is dead when that process no longer exists (or the pid was reused by a younger process). On any host a run
whose `mlops.heartbeat` is older than `stale_after` seconds is dead too: long runs beat, so a silent one is gone.

This module only judges (from tags, without the store); `mlops.tracking.reap` reads the store's RUNNING runs and
marks the dead ones KILLED, since tracking is the one module that talks to the store and reaps when a run starts.
"""

from __future__ import annotations

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
