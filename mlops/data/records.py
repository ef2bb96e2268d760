"""Sources to records: JSONL, Parquet and CSV files in chat, instruction or plain-text shape.

Every row becomes one `Record` (stable content id, source, line, capability domain, chat-form messages) or
one `Issue` that names the file, line, field and problem. The caller decides by policy whether an issue
stops the build. A source that changes while it is read always stops the build: a snapshot describes
exactly the bytes it read.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlops.errors import MLOpsError

ROLES = ("system", "user", "assistant")
KINDS = ("chat", "instruction", "text")


class BadInputError(MLOpsError):
    """A source row cannot be read as a record."""


class SourceChangedError(BadInputError):
    """A source file changed while it was being read."""


@dataclass(slots=True)
class Record:
    record_id: str
    source: str
    line: int
    domain: str
    kind: str
    messages: list[dict[str, str]]  # text records hold one {"role": "text", ...} message

    @property
    def text(self) -> str:
        return "\n".join(m["content"] for m in self.messages)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Record:
        return cls(**json.loads(line))


@dataclass(frozen=True, slots=True)
class Issue:
    file: str
    line: int
    field: str
    problem: str
    fix: str

    def message(self) -> str:
        field = f", field '{self.field}'" if self.field else ""
        return f"{self.file}, line {self.line}{field}: {self.problem}. Fix: {self.fix}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_id(kind: str, messages: list[dict[str, str]]) -> str:
    """Content id: the same conversation has the same id in any file, at any line."""
    blob = json.dumps([kind, [[m["role"], m["content"]] for m in messages]], ensure_ascii=False)
    return "r-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def source_format(path: Path, declared: str) -> str:
    if declared != "auto":
        return declared
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".csv", ".tsv"):
        return "csv"
    raise BadInputError(
        f"source '{path}' has an unknown suffix '{suffix}'. Fix: use .jsonl, .parquet or .csv, "
        "or set `format:` on the source."
    )


# --------------------------------------------------------------------------- shapes


def _text(row: dict, field: str, where: tuple[str, int], optional: bool = False) -> str | Issue:
    value = row.get(field)
    if value is None or (optional and value == ""):
        if optional:
            return ""
        return Issue(*where, field, f"missing field '{field}'", f"give every record a '{field}' string")
    if not isinstance(value, str):
        return Issue(*where, field, f"'{field}' is {type(value).__name__} {str(value)[:40]!r}, not a string",
                     f"write '{field}' as a string")
    return value


def normalise(row: Any, where: tuple[str, int]) -> tuple[str, list[dict[str, str]]] | Issue:
    """(kind, messages) for one raw row, or the Issue that explains why it is not a record."""
    if not isinstance(row, dict):
        return Issue(*where, "", f"a record must be a JSON object, got {type(row).__name__}",
                     "write one JSON object per line")
    if "messages" in row:
        return _chat(row["messages"], where)
    if "instruction" in row or "output" in row:
        parts = [_text(row, "instruction", where), _text(row, "input", where, optional=True),
                 _text(row, "output", where)]
        bad = next((p for p in parts if isinstance(p, Issue)), None)
        if bad:
            return bad
        instruction, extra, output = parts
        prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        return "instruction", [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    if "text" in row:
        text = _text(row, "text", where)
        return text if isinstance(text, Issue) else ("text", [{"role": "text", "content": text}])
    keys = ", ".join(sorted(map(str, row))[:8]) or "(none)"
    return Issue(*where, "", f"unknown record shape with keys [{keys}]",
                 "use `messages` (chat), `instruction`/`input`/`output` (instruction) or `text` (pretraining)")


def _chat(messages: Any, where: tuple[str, int]) -> tuple[str, list[dict[str, str]]] | Issue:
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)  # CSV cells hold the list as JSON
        except ValueError:
            return Issue(*where, "messages", "'messages' is a string that is not a JSON list",
                         "write messages as a list of {role, content} objects")
    if not isinstance(messages, list) or not messages:
        return Issue(*where, "messages", f"'messages' must be a non-empty list, got {str(messages)[:40]!r}",
                     "write messages as a list of {role, content} objects")
    out = []
    for i, msg in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(msg, dict):
            return Issue(*where, field, "a message must be an object", "write {\"role\": ..., \"content\": ...}")
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            return Issue(*where, f"{field}.role", f"unknown role {role!r}", f"use one of {', '.join(ROLES)}")
        if content is None:
            return Issue(*where, f"{field}.content", "missing field 'content'", "give every message a content string")
        if not isinstance(content, str):
            return Issue(*where, f"{field}.content", f"content is {type(content).__name__}, not a string",
                         "write content as a string")
        out.append({"role": role, "content": content})
    return "chat", out


def _domain(row: Any, default: str) -> str:
    value = row.get("domain") if isinstance(row, dict) else None
    return value.strip() if isinstance(value, str) and value.strip() else default


# --------------------------------------------------------------------------- readers


def _jsonl_rows(path: Path, name: str, digest) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            digest.update(raw)
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield number, Issue(name, number, "", f"not UTF-8: byte 0x{raw[err.start]:02x} at column {err.start + 1}",
                                    "re-encode the file as UTF-8")
                continue
            try:
                yield number, json.loads(text)
            except ValueError as err:
                yield number, Issue(name, number, "", f"malformed JSON: {err}", "write one valid JSON object per line")


def _csv_rows(path: Path, name: str, digest) -> Iterator[tuple[int, Any]]:
    state = {"line": 0}

    def lines() -> Iterator[str]:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                digest.update(raw)
                state["line"] = number
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    state["bad"] = Issue(name, number, "", f"not UTF-8: byte 0x{raw[err.start]:02x} at column "
                                         f"{err.start + 1}", "re-encode the file as UTF-8")
                    yield ""

    reader = csv.DictReader(lines())
    for row in reader:
        bad = state.pop("bad", None)
        if bad:
            yield bad.line, bad
            continue
        yield state["line"], {k: v for k, v in row.items() if k is not None and v not in (None, "")}


def _parquet_rows(path: Path, name: str, digest) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    digest.update(path.read_bytes())
    number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield number, {k: v for k, v in row.items() if v is not None}


READERS = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}


def read_source(path: Path, name: str, fmt: str, domain: str, expected_sha256: str) -> Iterator[Record | Issue]:
    """Records and issues of one source, in file order. Raises SourceChangedError if the bytes read differ
    from `expected_sha256` (hashed before reading) or the file changed size or mtime meanwhile."""
    before = path.stat()
    digest = hashlib.sha256()
    rows = 0
    last = 0
    for number, row in READERS[fmt](path, name, digest):
        last = number
        if isinstance(row, Issue):
            yield row
            continue
        rows += 1
        where = (name, number)
        shaped = normalise(row, where)
        if isinstance(shaped, Issue):
            yield shaped
            continue
        kind, messages = shaped
        yield Record(record_id(kind, messages), name, number, _domain(row, domain), kind, messages)
    after = path.stat() if path.exists() else None
    changed = after is None or (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns)
    if changed or digest.hexdigest() != expected_sha256:
        raise SourceChangedError(
            f"source '{name}' changed while it was being read (noticed after line {last}; it was hashed as "
            f"{expected_sha256[:12]} before reading). Fix: do not write to a source during a build; copy it "
            "to a stable location and build again."
        )
    if rows == 0:
        yield Issue(name, 0, "", "the source is empty (no records)", "remove it from data.sources or fill it")
