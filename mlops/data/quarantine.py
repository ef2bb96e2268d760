"""The quarantine folder of a snapshot: every record or row set aside, with its stage, reason code and a
PII-redacted, bounded excerpt.

    quarantine/records.jsonl     records rejected by a filter, decontamination, dedup or a per-record check
    quarantine/bad_input.jsonl   rows that are not records (file, line, field, code, problem, excerpt)
    quarantine/batches/...       batches the expectation suite set aside (on_batch_failure=quarantine)

Nothing of a rejected record is written whole: each message keeps at most `data.excerpt_chars` characters,
and those pass through `mlops.data.pii.redact` (every PII detector, whatever `data.pii.types` says), so a
50 MB record costs a few hundred bytes here and an address that a filter caught before scrubbing never leaks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlops.data.pii import redact
from mlops.data.records import Issue, Record


def excerpt(messages: list[dict[str, str]], limit: int) -> list[dict[str, Any]]:
    """Each message as {role, content (redacted, at most `limit` characters), chars (its full length)}."""
    return [{"role": m["role"], "content": redact(m["content"], limit) if limit else "", "chars": len(m["content"])}
            for m in messages]


def entry(record: Record, stage: str, reason: str, detail: dict | None = None,
          messages: list[dict[str, Any]] | None = None, limit: int = 500) -> dict[str, Any]:
    row = {"stage": stage, "reason": reason, "record_id": record.record_id, "source": record.source,
           "line": record.line, "domain": record.domain, "kind": record.kind,
           "excerpt": messages if messages is not None else excerpt(record.messages, limit), **(detail or {})}
    if getattr(record, "provenance", None):  # a pair names the request or spot-check it came from
        row["provenance"] = record.provenance
    return row


class Quarantine:
    def __init__(self, folder: Path, excerpt_chars: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.limit = excerpt_chars
        self._records = (folder / "records.jsonl").open("w", encoding="utf-8")
        self._bad = (folder / "bad_input.jsonl").open("w", encoding="utf-8")

    def record(self, record: Record, stage: str, reason: str, detail: dict | None = None,
               messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        row = entry(record, stage, reason, detail, messages, self.limit)
        self._records.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
        return row

    def issue(self, issue: Issue) -> dict[str, Any]:
        row = issue.as_dict()
        self._bad.write(json.dumps(row, ensure_ascii=False) + "\n")
        return row

    def close(self) -> None:
        self._records.close()
        self._bad.close()
