"""Sources to records: JSONL, Parquet and CSV files in chat, instruction, plain-text or preference-pair shape.

Every row becomes one `Record` (stable content id, source, line, capability domain, chat-form messages) or
one `Issue` that names the file, line, field, problem and a reason code, with a PII-redacted excerpt of the
row. Problems are `RecordError` subclasses; the reason code is the class's, never parsed from a message, and
no message quotes a value from the row. The caller decides by policy whether an issue stops the build. A
file that cannot be read on (a truncated Parquet file) ends that source with an issue. A source that changes
while it is read always stops the build: a snapshot describes exactly the bytes it read.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlops.errors import MLOpsError

ROLES = ("system", "user", "assistant")
KINDS = ("chat", "instruction", "text", "pair")
# A pair record's messages: its prompt turns, then {"role": "chosen", ...} and {"role": "rejected", ...} (always
# the last two), so every step that walks messages (PII scrubbing, decontamination, excerpts) sees all three parts.
PAIR_ROLES = ("chosen", "rejected")
PROVENANCE_MAX_CHARS = 2000  # ids, not documents: it travels in every shard meta line of its pair


class BadInputError(MLOpsError):
    """A source row cannot be read as a record."""


class SourceChangedError(BadInputError):
    """A source file changed while it was being read."""


class RecordError(BadInputError):
    """One row is not a record. `code` is the reason counter (`bad_input.<code>`); `fix` says what to do."""

    code = "invalid_record"

    def __init__(self, problem: str, fix: str, field: str = "") -> None:
        super().__init__(problem)
        self.problem, self.fix, self.field = problem, fix, field


class NotUTF8(RecordError):
    code = "not_utf8"


class MalformedJSON(RecordError):
    code = "malformed_json"


class MalformedCSV(RecordError):
    code = "malformed_csv"


class UnreadableFile(RecordError):
    code = "unreadable_file"


class UnknownShape(RecordError):
    code = "unknown_shape"


class MissingField(RecordError):
    code = "missing_field"


class WrongType(RecordError):
    code = "wrong_type"


class UnknownRole(RecordError):
    code = "unknown_role"


class RoleOrder(RecordError):
    code = "role_order"


class EmptySource(RecordError):
    code = "empty_source"


class MixedRecordTypes(BadInputError):
    """A chat record in a preference build or a pair in a chat build: one snapshot holds one record type. Always
    stops the build (whatever data.on_bad_record says): the sources or data.record_type are wrong, not one row."""


@dataclass(slots=True)
class Record:
    record_id: str
    source: str
    line: int
    domain: str
    kind: str
    messages: list[dict[str, str]]  # text records hold one {"role": "text", ...} message; pairs: see PAIR_ROLES
    provenance: dict[str, Any] | None = None  # where a pair came from (request, trace, spot-check ids); else None

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
    code: str = "invalid_record"
    excerpt: str = ""  # the row, PII-redacted and bounded

    @classmethod
    def of(cls, err: RecordError, file: str, line: int, raw: Any = None) -> Issue:
        from mlops.data.pii import redact

        excerpt = "" if raw is None else redact(raw if isinstance(raw, str) else _short_json(raw), EXCERPT_CHARS)
        return cls(file, line, err.field, err.problem, err.fix, type(err).code, excerpt)

    def message(self) -> str:
        field = f", field '{self.field}'" if self.field else ""
        return f"{self.file}, line {self.line}{field}: {self.problem}. Fix: {self.fix}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


EXCERPT_CHARS = 200


def _short_json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)[: EXCERPT_CHARS * 2]
    except (TypeError, ValueError):
        return type(value).__name__


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


def _role_order(messages: list[dict[str, str]]) -> None:
    """System turns first, then a user turn: a chat that opens with the assistant has nothing it answers."""
    roles = [m["role"] for m in messages]
    first = next((i for i, r in enumerate(roles) if r != "system"), None)
    if first is not None and roles[first] != "user":
        raise RoleOrder(f"the conversation starts with a{'n' if roles[first][0] in 'aeiou' else ''} {roles[first]} "
                        f"turn (messages[{first}]) instead of a user turn", "start every conversation with a user "
                        "turn, after any system turns", f"messages[{first}].role")
    late = next((i for i, r in enumerate(roles) if r == "system" and first is not None and i > first), None)
    if late is not None:
        raise RoleOrder(f"a system turn (messages[{late}]) follows the conversation's first user turn",
                        "put system turns before the first user turn", f"messages[{late}].role")


# --------------------------------------------------------------------------- shapes


def _text(row: dict, field: str, optional: bool = False) -> str:
    value = row.get(field)
    if value is None or (optional and value == ""):
        if optional:
            return ""
        raise MissingField(f"missing field '{field}'", f"give every record a '{field}' string", field)
    if not isinstance(value, str):
        raise WrongType(f"'{field}' is {_a(value)}, not a string", f"write '{field}' as a string", field)
    return value


# Role names other datasets use: safe to quote. Any other value might be a name or an address: not quoted.
COMMON_ROLES = {"bot", "human", "gpt", "model", "ai", "agent", "customer", "client", "tool", "function", "ipython",
                "developer", "operator", "support", "assistant_", "sys", "usr", "prompter", "chatbot", "response"}


def _field_name(key: str) -> str:
    """A key as it may be quoted in a problem: a plain identifier, else only its length (keys can hold data)."""
    return key if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]{0,29}", key) else f"<{len(key)} chars>"


def _a(value: Any) -> str:
    """'an int', 'a list': the type of a value, never the value (it may hold personal data)."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def normalise(row: Any) -> tuple[str, list[dict[str, str]]]:
    """(kind, messages) for one raw row; raises the RecordError that explains why it is not a record."""
    if not isinstance(row, dict):
        raise WrongType(f"a record must be a JSON object, got {_a(row)}", "write one JSON object per line")
    if "chosen" in row or "rejected" in row:
        return "pair", _pair(row)
    if "messages" in row:
        messages = _chat(row["messages"])
        _role_order(messages)
        return "chat", messages
    if "instruction" in row or "output" in row:
        instruction, extra, output = _text(row, "instruction"), _text(row, "input", True), _text(row, "output")
        prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        return "instruction", [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    if "text" in row:
        return "text", [{"role": "text", "content": _text(row, "text")}]
    keys = ", ".join(_field_name(k) for k in sorted(map(str, row))[:8]) or "(none)"
    raise UnknownShape(f"unknown record shape with keys [{keys}]", "use `messages` (chat), `instruction`/`input`/"
                       "`output` (instruction), `text` (pretraining) or `prompt`/`messages` with `chosen` and "
                       "`rejected` (preference pair)")


def _pair(row: dict) -> list[dict[str, str]]:
    """Prompt turns (a `prompt` string is one user turn) ending in a user turn, then the chosen and rejected answers.
    Empty or identical answers are read here and set aside later by the pair checks, with a reason."""
    if ("prompt" in row) == ("messages" in row):
        both = "both `prompt` and `messages`" if "prompt" in row else "neither `prompt` nor `messages`"
        raise UnknownShape(f"a preference pair with {both}", "give the prompt as `prompt` (one user turn) or as "
                           "`messages` (turns ending in a user turn), not both")
    if "prompt" in row:
        prompt = [{"role": "user", "content": _text(row, "prompt")}]
    else:
        prompt = _chat(row["messages"])
        _role_order(prompt)
        if prompt[-1]["role"] != "user":
            last = len(prompt) - 1
            raise RoleOrder(f"the prompt ends with a{'n' if prompt[-1]['role'][0] in 'aeiou' else ''} "
                            f"{prompt[-1]['role']} turn (messages[{last}]); a pair answers the last user turn",
                            "end `messages` with the user turn that `chosen` and `rejected` answer",
                            f"messages[{last}].role")
    return [*prompt, {"role": "chosen", "content": _text(row, "chosen")},
            {"role": "rejected", "content": _text(row, "rejected")}]


def _provenance(row: Any, kind: str) -> dict[str, Any] | None:
    """A pair's `provenance` object (and a `source` string, kept as provenance["source"]); None for other kinds."""
    if kind != "pair" or not isinstance(row, dict):
        return None
    value = row.get("provenance")
    if value is not None and not isinstance(value, dict):
        raise WrongType(f"'provenance' is {_a(value)}, not an object", "write provenance as a JSON object of ids, "
                        "e.g. {\"request_id\": ..., \"trace_id\": ...}", "provenance")
    out = dict(value or {})
    source = row.get("source")
    if source is not None:
        if not isinstance(source, str):
            raise WrongType(f"'source' is {_a(source)}, not a string", "write source as a string", "source")
        out["source"] = source
    try:
        size = len(json.dumps(out, ensure_ascii=False, sort_keys=True))
    except (TypeError, ValueError):
        raise WrongType("'provenance' holds values that are not JSON", "keep provenance to strings, numbers and "
                        "lists of them", "provenance") from None
    if size > PROVENANCE_MAX_CHARS:
        raise WrongType(f"'provenance' is {size} characters, over {PROVENANCE_MAX_CHARS}", "keep provenance to "
                        "the ids a pair came from (request, trace, spot-check)", "provenance")
    return out or None


def to_record(row: Any, name: str, number: int, default_domain: str) -> Record:
    """One raw row as a Record (raises the RecordError that explains why it is not one)."""
    kind, messages = normalise(row)
    provenance = _provenance(row, kind)
    return Record(record_id(kind, messages), name, number, _domain(row, default_domain), kind, messages, provenance)


def _chat(messages: Any) -> list[dict[str, str]]:
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)  # CSV cells hold the list as JSON
        except ValueError:
            raise MalformedJSON("'messages' is a string that is not a JSON list",
                                "write messages as a list of {role, content} objects", "messages") from None
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if isinstance(messages, list) else _a(messages)
        raise WrongType(f"'messages' must be a non-empty list, got {got}",
                        "write messages as a list of {role, content} objects", "messages")
    out = []
    for i, msg in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise WrongType("a message must be an object", "write {\"role\": ..., \"content\": ...}", field)
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            shown = repr(role) if role is None or str(role).lower() in COMMON_ROLES else _a(role)
            raise UnknownRole(f"unknown role {shown}", f"use one of {', '.join(ROLES)}", f"{field}.role")
        if content is None:
            raise MissingField("missing field 'content'", "give every message a content string", f"{field}.content")
        if not isinstance(content, str):
            raise WrongType(f"content is {_a(content)}, not a string", "write content as a string",
                            f"{field}.content")
        out.append({"role": role, "content": content})
    return out


def _domain(row: Any, default: str) -> str:
    value = row.get("domain") if isinstance(row, dict) else None
    return value.strip() if isinstance(value, str) and value.strip() else default


# --------------------------------------------------------------------------- readers


# A reader yields (line, row, raw): row is a raw row or the RecordError that stopped it; raw is the row as read,
# for a redacted excerpt.
Row = tuple[int, Any, Any]


def _not_utf8(raw: bytes, err: UnicodeDecodeError) -> NotUTF8:
    return NotUTF8(f"not UTF-8: byte 0x{raw[err.start]:02x} at column {err.start + 1}", "re-encode the file as UTF-8")


BOM = b"\xef\xbb\xbf"


def _json_array_rows(path: Path, digest) -> Iterator[Row] | None:
    """A `.json` file holding one array of records (not JSON Lines): its elements, numbered from 1."""
    if path.suffix.lower() != ".json":
        return None
    with path.open("rb") as fh:
        head = fh.read(4096).removeprefix(BOM).lstrip()
    if not head.startswith(b"["):
        return None

    def rows() -> Iterator[Row]:
        data = path.read_bytes()
        digest.update(data)
        try:
            items = json.loads(data.removeprefix(BOM).decode("utf-8"))
        except UnicodeDecodeError as err:
            yield 1, _not_utf8(data, err), ""
            return
        except (json.JSONDecodeError, RecursionError) as err:
            where = f" at line {err.lineno}, column {err.colno}" if isinstance(err, json.JSONDecodeError) else ""
            yield 1, MalformedJSON(f"malformed JSON array{where}", "write valid JSON, or one object per line"), ""
            return
        for number, item in enumerate(items, start=1):
            yield number, item, item

    return rows()


def _jsonl_rows(path: Path, digest) -> Iterator[Row]:
    array = _json_array_rows(path, digest)
    if array is not None:
        yield from array
        return
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            digest.update(raw)
            if number == 1:
                raw = raw.removeprefix(BOM)  # files saved by Excel or Notepad start with one
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield number, _not_utf8(raw, err), raw.decode("utf-8", "replace")
                continue
            try:
                yield number, json.loads(text), text
            except json.JSONDecodeError as err:
                yield number, MalformedJSON(f"malformed JSON: {err.msg} at column {err.colno}",
                                            "write one valid JSON object per line"), text
            except RecursionError:
                yield number, MalformedJSON("malformed JSON: nested too deeply", "write one JSON object per line"), ""


# csv's own field limit (128 KiB) would abort the file at the first long cell. Cells are read up to this bound;
# a long record is then rejected by the length filter with a bounded excerpt, like any other.
CSV_FIELD_LIMIT = 256 * 1024 * 1024


def _csv_rows(path: Path, digest) -> Iterator[Row]:
    state: dict[str, Any] = {"line": 0}

    def lines() -> Iterator[str]:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                digest.update(raw)
                state["line"] = number
                try:
                    yield (raw.removeprefix(BOM) if number == 1 else raw).decode("utf-8")
                except UnicodeDecodeError as err:
                    state["bad"] = (number, _not_utf8(raw, err), raw.decode("utf-8", "replace"))
                    yield ""

    previous = csv.field_size_limit(min(CSV_FIELD_LIMIT, sys.maxsize))
    try:
        reader = csv.DictReader(lines(), delimiter=_delimiter(path))
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as err:
                state.pop("bad", None)
                yield state["line"], MalformedCSV(f"malformed CSV: {err}", "quote fields that hold commas, "
                                                  "quotes or line breaks"), ""
                continue
            bad = state.pop("bad", None)
            if bad:
                yield bad
                continue
            yield state["line"], {k: v for k, v in row.items() if k is not None and v not in (None, "")}, row
    finally:
        csv.field_size_limit(previous)


def _delimiter(path: Path) -> str:
    """Tab for .tsv; otherwise whichever of , ; tab | the header line uses most (European exports use ;)."""
    if path.suffix.lower() == ".tsv":
        return "\t"
    with path.open("rb") as fh:
        header = fh.readline().decode("utf-8", "replace")
    return max(",;\t|", key=lambda d: (header.count(d), d == ","))


def _parquet_rows(path: Path, digest) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    digest.update(path.read_bytes())
    number = 0
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield number, {k: v for k, v in row.items() if v is not None}, row
    except (pa.ArrowException, OSError) as err:
        # The rest of the file cannot be reached: one issue names where reading stopped, the rows before it stay.
        yield number + 1, UnreadableFile(f"the Parquet file cannot be read past row {number} "
                                         f"({type(err).__name__})", "rewrite the file; it is truncated or corrupt"), ""


READERS = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}


def read_source(path: Path, name: str, fmt: str, domain: str, expected_sha256: str) -> Iterator[Record | Issue]:
    """Records and issues of one source, in file order. Raises SourceChangedError if the bytes read differ
    from `expected_sha256` (hashed before reading) or the file changed size or mtime meanwhile."""
    before = path.stat()
    digest = hashlib.sha256()
    rows = 0
    last = 0
    for number, row, raw in READERS[fmt](path, digest):
        last = number
        if isinstance(row, RecordError):
            yield Issue.of(row, name, number, raw)
            continue
        rows += 1
        try:
            record = to_record(row, name, number, domain)
        except RecordError as err:
            yield Issue.of(err, name, number, raw)
            continue
        yield record
    after = path.stat() if path.exists() else None
    changed = after is None or (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns)
    if changed or digest.hexdigest() != expected_sha256:
        raise SourceChangedError(
            f"source '{name}' changed while it was being read (noticed after line {last}; it was hashed as "
            f"{expected_sha256[:12]} before reading). Fix: do not write to a source during a build; copy it "
            "to a stable location and build again."
        )
    if rows == 0 and last == 0:
        yield Issue.of(EmptySource("the source is empty (no records)", "remove it from data.sources or fill it"),
                       name, 0)
