"""One writer per checkpoint folder: an advisory lock (flock) held by the process that owns the job.

The holder (pid, host, start time, run id) is written into the lock file, so a refused trainer can say who is
training. The kernel drops the lock when its holder dies, so a lock file whose flock is free is stale: it is
taken over with a warning. Workers of a multi-process job register under `.workers/`; a new holder waits a
few seconds for registered workers of a dead job to go (they die with their launcher) before it writes.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from mlops.errors import MLOpsError

log = logging.getLogger(__name__)
LOCK_FILE = ".train.lock"
WORKERS_DIR = ".workers"


class AlreadyTraining(MLOpsError):
    """Another live process trains into this checkpoint folder."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def process_identity(pid: int | None = None) -> dict:
    """pid, host and the process's start time: the start time tells a live process from a reused pid."""
    import psutil

    pid = pid or os.getpid()
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        created = None
    return {"pid": pid, "host": socket.gethostname(), "created": created}


def still_running(entry: dict) -> bool:
    """Whether a registered process is alive: same host, pid alive, same start time."""
    import psutil

    if entry.get("host") != socket.gethostname() or not entry.get("pid"):
        return False
    try:
        proc = psutil.Process(int(entry["pid"]))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return entry.get("created") is None or abs(proc.create_time() - float(entry["created"])) < 1e-3
    except psutil.Error:
        return False


def register_worker(folder: Path, rank: int) -> None:
    """A worker of a multi-process job records itself (the launcher forwards signals to it, drills check it)."""
    workers = folder / WORKERS_DIR
    workers.mkdir(parents=True, exist_ok=True)
    (workers / f"rank-{rank}.json").write_text(json.dumps({**process_identity(), "rank": rank}))


def registered_workers(folder: Path) -> list[dict]:
    return [_read(p) for p in sorted((folder / WORKERS_DIR).glob("rank-*.json"))]


def live_workers(folder: Path) -> list[dict]:
    return [w for w in registered_workers(folder) if still_running(w)]


class TrainLock:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / LOCK_FILE
        self._fh = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    def acquire(self, *, worker_wait: float = 15.0) -> TrainLock:
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the lock's lifetime
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise AlreadyTraining(self._refusal(_read(self.path))) from None
        self._fh = fh
        previous = _read(self.path)
        if previous.get("pid") and not previous.get("released"):
            log.warning("taking over the lock of %s left by pid %s on host %s (since %s): that process is no "
                        "longer running", self.path, previous.get("pid"), previous.get("host"), previous.get("since"))
        try:
            self._wait_for_workers(worker_wait)
        except BaseException:
            self.release()
            raise
        self.update(**process_identity(), since=_now(), released=False)
        return self

    def _wait_for_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        alive = live_workers(self.folder)
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = live_workers(self.folder)
        if alive:
            pids = ", ".join(f"{w['pid']} (rank {w.get('rank')})" for w in alive)
            raise AlreadyTraining(
                f"checkpoint folder {self.folder} is free, but workers of a previous job are still running on this "
                f"host after {timeout:g} s: pids {pids}. They would keep writing checkpoints. Fix: stop them "
                f"(kill -KILL {' '.join(str(w['pid']) for w in alive)}) and rerun."
            )
        for stale in (self.folder / WORKERS_DIR).glob("rank-*.json"):
            stale.unlink(missing_ok=True)

    def _refusal(self, holder: dict) -> str:
        who = (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since {holder.get('since', '?')}"
               + (f" (run {holder['run_id']})" if holder.get("run_id") else ""))
        return (
            f"checkpoint folder {self.folder} is already training as {who}. A second trainer would overwrite its "
            f"checkpoints and double its run's metrics. Fix: wait for it to finish, stop it (`kill -TERM "
            f"{holder.get('pid', '<pid>')}` on {holder.get('host', 'its host')} saves a checkpoint first, then "
            "rerun to resume), or train into another folder with train.checkpoint.dir=<path>."
        )

    def holder(self) -> str | None:
        """Who trains into the folder, from the lock file alone (probing the flock could refuse a trainer that
        starts at that moment): None when released or held by a dead process of this host."""
        h = _read(self.path)
        if not h.get("pid") or h.get("released"):
            return None
        if h.get("host") == socket.gethostname() and not still_running(h):
            return None
        return f"training as pid {h.get('pid')} on host {h.get('host')} since {h.get('since')}"

    def update(self, **fields) -> None:
        """Rewrite the holder record (e.g. with the run id once it is known)."""
        if self._fh is None:
            return
        record = {**_read(self.path), **fields}
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(json.dumps(record, sort_keys=True))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def release(self) -> None:
        if self._fh is None:
            return
        import fcntl

        try:
            self.update(released=True, released_at=_now())
        except OSError:
            pass  # a full disk must not keep the lock: the flock below is what counts
        fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None

    def __del__(self) -> None:  # a Prepared dropped without train(): never keep a folder locked
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
