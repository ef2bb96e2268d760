"""Sources cut into partitions that workers read themselves, so no process reads every record.

A partition is a whole source, or for a JSON Lines source larger than `PARTITION_BYTES`, the lines that start in
one byte range of it. The cut depends only on the file (never on the worker count). The driver finds the cuts
with one pass over the bytes (a newline count and a sha256 per range, no parsing), so a worker knows the line
number its range starts at and can prove that the bytes it parsed are the bytes the build hashed.

Every record is keyed by its position in the build, (source order, line): partitions are numbered in that order,
and the dedup keeps the record with the smallest key of each duplicate cluster (mlops.data.lsh), so neither the
cut nor the worker count changes which records are kept.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mlops.data.records import (
    BOM,
    Issue,
    MalformedJSON,
    Record,
    RecordError,
    SourceChangedError,
    _not_utf8,
    read_source,
    to_record,
)

PARTITION_BYTES = 32 * 2**20  # about 60k chat records: enough work per task, bounded memory per worker
SCAN_BLOCK = 8 * 2**20


@dataclass(frozen=True)
class Partition:
    number: int
    source: dict  # the entry of Inputs.sources (name, path, format, domain, sha256)
    start: int = 0  # byte range [start, end) of a JSON Lines source; end < 0: the whole file through read_source
    end: int = -1
    first_line: int = 1
    sha256: str = ""  # of the bytes in [start, end)


def plan_partitions(sources: list[dict], part_bytes: int | None = None) -> list[Partition]:
    """The partitions of every source, in source order."""
    size = part_bytes or PARTITION_BYTES
    out: list[Partition] = []
    for src in sources:
        path = Path(src["path"])
        if src["format"] != "jsonl" or path.stat().st_size <= size or _is_json_array(path):
            out.append(Partition(len(out), src))
            continue
        whole = hashlib.sha256()
        for start, end, line, digest in _cuts(path, size, whole):
            out.append(Partition(len(out), src, start, end, line, digest))
        if whole.hexdigest() != src["sha256"]:  # changed since the build hashed it: the ranges would not match
            raise SourceChangedError(
                f"source '{src['name']}' changed after the build hashed it (it was {src['sha256'][:12]}). Fix: do "
                "not write to a source during a build; copy it to a stable location and build again."
            )
    return out


def _is_json_array(path: Path) -> bool:
    if path.suffix.lower() != ".json":
        return False
    with path.open("rb") as fh:
        return fh.read(4096).removeprefix(BOM).lstrip().startswith(b"[")


def _cuts(path: Path, size: int, whole) -> Iterator[tuple[int, int, int, str]]:
    """(start, end, first line, sha256) per range: each cut is just after the first newline past a multiple of size."""
    total = path.stat().st_size
    with path.open("rb") as fh:
        start, line = 0, 1
        while start < total:
            fh.seek(start + size) if start + size < total else fh.seek(total)
            if fh.tell() < total:
                fh.readline()
            end = fh.tell()
            digest, newlines = hashlib.sha256(), 0
            fh.seek(start)
            left = end - start
            while left > 0:
                block = fh.read(min(SCAN_BLOCK, left))
                digest.update(block)
                whole.update(block)
                newlines += block.count(b"\n")
                left -= len(block)
            yield start, end, line, digest.hexdigest()
            start, line = end, line + newlines


def read_partition(part: Partition) -> Iterator[Record | Issue]:
    """Records and issues of one partition in file order (what read_source yields for its lines)."""
    src = part.source
    if part.end < 0:
        yield from read_source(Path(src["path"]), src["name"], src["format"], src["domain"], src["sha256"])
        return
    with Path(src["path"]).open("rb") as fh:
        fh.seek(part.start)
        data = fh.read(part.end - part.start)
    if hashlib.sha256(data).hexdigest() != part.sha256:
        raise SourceChangedError(
            f"source '{src['name']}' changed while it was being read (bytes {part.start}-{part.end} from line "
            f"{part.first_line} differ from what the build hashed before reading). Fix: do not write to a source "
            "during a build; copy it to a stable location and build again."
        )
    lines = [line + b"\n" for line in data.split(b"\n")]  # as file iteration splits: on "\n" only
    lines[-1] = lines[-1][:-1]
    for number, raw in enumerate(lines if lines[-1] else lines[:-1], start=part.first_line):
        item = _row(raw.removeprefix(BOM) if number == 1 else raw, number, src)
        if item is not None:
            yield item


def _row(raw: bytes, number: int, src: dict) -> Record | Issue | None:
    """One JSON Lines row, exactly as mlops.data.records reads it."""
    if not raw.strip():
        return None
    name = src["name"]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return Issue.of(_not_utf8(raw, err), name, number, raw.decode("utf-8", "replace"))
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        return Issue.of(MalformedJSON(f"malformed JSON: {err.msg} at column {err.colno}",
                                      "write one valid JSON object per line"), name, number, text)
    except RecursionError:
        return Issue.of(MalformedJSON("malformed JSON: nested too deeply", "write one JSON object per line"),
                        name, number, "")
    try:
        return to_record(row, name, number, src["domain"])
    except RecordError as err:
        return Issue.of(err, name, number, text)
