"""The step trace: rank 0 appends one line per optimizer step (loss and grad norm as exact float hex, the
learning rate, the data position and every sample id). A resume drops the lines after its checkpoint, so the
finished trace is the run's trajectory as if it had never stopped; the kill drill and the tests compare it."""

from __future__ import annotations

import json
import os
from pathlib import Path

TRACE = "trace.jsonl"


class TraceLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("a", buffering=1)  # line-buffered: a killed run leaves whole lines

    @classmethod
    def open(cls, path: Path, *, truncate_after: int) -> TraceLog:
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if path.exists() and truncate_after > 0:
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line)["step"] <= truncate_after:
                        kept.append(line)
                except (ValueError, KeyError):
                    break  # a torn last line from a kill
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(k + "\n" for k in kept))
        os.replace(tmp, path)
        return cls(path)

    def write(self, record: dict) -> None:
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
