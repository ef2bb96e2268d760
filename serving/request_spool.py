"""Request-log rows a stopping server could not write in time, kept on disk until a later server writes them.

A drain has a deadline (`serve.request_log.drain_seconds`): an orchestrator kills a server whose grace period is
over, and a backlog built up under sustained traffic can take longer than that to write. What is still queued at the
deadline is scrubbed (the spool holds no more than the traces would) and written to a file under
`.mlops/serve/request-log-spool/<store>/`; the next server that logs to the same store writes it first, then deletes
it. Writing rows again is safe: a trace id is its request id's hash, so a row whose trace landed is skipped and a
half-written one is completed (`mlops.requestlog.write_requests`). Feedback waiting behind a spooled answer is
spooled with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, fields
from pathlib import Path

from mlops.files import pid_alive
from mlops.requestlog import Feedback, LoggedRequest, log_url, scrubbed

SUFFIX = ".jsonl"
CLAIMED = ".replaying-"


def spool_dir(url: str | None) -> Path:
    from mlops.paths import mlops_dir

    store_key = hashlib.sha256(log_url(url).encode()).hexdigest()[:12]
    return mlops_dir() / "serve" / "request-log-spool" / store_key


def spool(rows: list[LoggedRequest], feedback: list[Feedback], url: str | None) -> Path | None:
    """Write the rows and feedback to a new spool file (atomically, synced); None when there is nothing to keep."""
    from mlops.files import atomic_write_text

    if not rows and not feedback:
        return None
    lines = [json.dumps({"request": asdict(scrubbed(r))}, ensure_ascii=False) for r in rows]
    lines += [json.dumps({"feedback": asdict(f)}, ensure_ascii=False) for f in feedback]
    path = spool_dir(url) / f"{time.time_ns()}-{os.getpid()}{SUFFIX}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, "\n".join(lines) + "\n", fsync=True)


def claim(url: str | None) -> list[Path]:
    """The spool files of this store, each renamed for this process so that two servers starting together never
    both take one; files a dead server had claimed are taken back."""
    folder = spool_dir(url)
    if not folder.is_dir():
        return []
    mine = []
    for path in sorted(folder.iterdir()):
        owner = path.name.rpartition(CLAIMED)[2] if CLAIMED in path.name else None
        if path.name.endswith(f"-{os.getpid()}{SUFFIX}"):
            continue  # spooled by this process as it stops: never its own next batch
        if path.name.endswith(SUFFIX) or (owner and owner.isdigit() and not pid_alive(int(owner))):
            target = folder / f"{path.name.partition(CLAIMED)[0]}{CLAIMED}{os.getpid()}"
            try:
                path.rename(target)
            except FileNotFoundError:  # another server took it first
                continue
            mine.append(target)
    return mine


def release(path: Path) -> None:
    """Give a claimed file back (its rows could not be written now); the next start tries again."""
    path.rename(path.with_name(path.name.partition(CLAIMED)[0]))


def load(path: Path) -> tuple[list[LoggedRequest], list[Feedback]]:
    rows, feedback = [], []
    names = {f.name for f in fields(LoggedRequest)}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue  # a file is written whole (atomically); a blank line is only the end
        item = json.loads(line)
        if "request" in item:
            rows.append(LoggedRequest(**{k: v for k, v in item["request"].items() if k in names}))
        else:
            feedback.append(Feedback(**item["feedback"]))
    return rows, feedback
