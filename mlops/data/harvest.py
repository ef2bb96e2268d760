"""The loop back: served requests that users marked bad or corrected become reviewed training data.

    harvest(since, out)            -> increment.jsonl: one row per request with negative feedback or a correction
                                      (request id, scrubbed prompt, the model's answer, correction, rating,
                                      `accepted: null` for a person to set true or false; re-running merges)
    review(out, request_id, ...)   -> set one row's decision (what the app calls)
    accept(out)                    -> accepted.jsonl: chat records whose assistant turn is the correction, plus
                                      accepted.jsonl.provenance.json naming the requests and feedback they came from
    increment_config(cfg, out, history=..., ratio=0.3) -> the config of a snapshot built from the accepted source,
                                      mixed with a history snapshot (7:3 new to old by default) and deduplicated
                                      against it (and any earlier snapshots the config names)

The snapshot build copies the provenance file into its manifest's `sources` entry, so the snapshot names
every request and feedback it learned from. Texts come from the request log, which scrubbed PII when it
stored them; the build scrubs again like any source.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlops.errors import MLOpsError

INCREMENT = "increment.jsonl"
INCREMENT_META = "increment.json"
ACCEPTED = "accepted.jsonl"
PROVENANCE_SUFFIX = ".provenance.json"
REVIEW_FIELDS = ("accepted", "note", "correction")


class HarvestError(MLOpsError):
    """An increment cannot be harvested, reviewed or accepted as it is."""


def parse_since(text: str) -> float:
    """An ISO time (naive means UTC) as epoch seconds."""
    try:
        moment = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise HarvestError(f"--since '{text}' is not an ISO time. Fix: pass e.g. 2026-11-30T18:00:00Z.") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def collect(since: float, *, model: str | None = None, url: str | None = None) -> tuple[list[dict], int]:
    """(rows, feedback for requests no longer logged): requests whose newest feedback since `since` is negative,
    or that got a correction."""
    from mlops.requestlog import read_feedback

    by_request: dict[str, list[dict]] = {}
    for fb in read_feedback(since=since, url=url):
        by_request.setdefault(fb["request_id"], []).append(fb)
    wanted = {rid: fbs for rid, fbs in by_request.items()
              if fbs[-1]["rating"] < 0 or any((f.get("correction") or "").strip() for f in fbs)}
    requests = _requests(sorted(wanted), url)
    rows, missing = [], 0
    for rid, fbs in wanted.items():
        req = requests.get(rid)
        if req is None or (model and req["model"] != model):
            missing += req is None
            continue
        corrections = [f["correction"].strip() for f in fbs if (f.get("correction") or "").strip()]
        rows.append({"request_id": rid, "model": req["model"], "version": req["version"], "ts": _iso(req["ts"]),
                     "messages": req["messages"], "answer": req["response"],
                     "correction": corrections[-1] if corrections else None, "rating": fbs[-1]["rating"],
                     "feedback_ids": [f["feedback_id"] for f in fbs], "accepted": None, "note": ""})
    rows.sort(key=lambda r: (r["ts"], r["request_id"]))
    return rows, missing


def _requests(ids: list[str], url: str | None) -> dict[str, dict]:
    """User-facing logged requests by id, read back from their traces (a shadow's answer was never shown)."""
    from mlops.requestlog import read_requests

    return {row["request_id"]: row for row in read_requests(request_ids=ids, url=url) if row["role"] != "shadow"}


def harvest(since: str, out: Path | str, *, model: str | None = None, url: str | None = None) -> dict:
    """Write (or extend) the increment in `out`; rows already there keep their review."""
    from mlops.files import atomic_write_json

    out = Path(out)
    rows, missing = collect(parse_since(since), model=model, url=url)
    existing = {r["request_id"]: r for _, r in read_increment(out)} if (out / INCREMENT).exists() else {}
    added = [r for r in rows if r["request_id"] not in existing]
    merged = sorted([*existing.values(), *added], key=lambda r: (r["ts"], r["request_id"]))
    out.mkdir(parents=True, exist_ok=True)
    _write_rows(out / INCREMENT, merged)
    meta = {"since": _iso(parse_since(since)), "model": model, "harvested_at": _iso(time.time()),
            "rows": len(merged), "added": len(added), "feedback_without_request": missing}
    atomic_write_json(out / INCREMENT_META, meta)
    return {**meta, "path": str(out / INCREMENT), "pending": sum(r["accepted"] is None for r in merged)}


def read_increment(out: Path | str) -> list[tuple[int, dict]]:
    return read_reviewed_rows(Path(out) / INCREMENT, key="request_id", editable="accepted, note and correction",
                              missing=f"run `mlops data harvest --since <time> --out {out}`")


def read_reviewed_rows(path: Path, *, key: str, editable: str, missing: str) -> list[tuple[int, dict]]:
    """(line number, row) of a harvested file people review by hand: each line one JSON object carrying `key`."""
    if not path.is_file():
        raise HarvestError(f"'{path.parent}' holds no {path.name}. Fix: {missing}.")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise HarvestError(f"{path}, line {number}: not valid JSON ({err}). Fix: keep one JSON object per line; "
                               f"edit only the {editable} fields.") from None
        if not isinstance(row, dict) or not row.get(key):
            raise HarvestError(f"{path}, line {number}: not a harvested row (no {key}). Fix: restore the line the "
                               "harvest wrote.")
        rows.append((number, row))
    return rows


def review(out: Path | str, request_id: str, accepted: bool | None, *, note: str = "",
           correction: str | None = None) -> dict:
    """Set one row's decision (and optionally its correction); returns the row."""
    rows = read_increment(out)
    for _, row in rows:
        if row["request_id"] == request_id:
            row.update(accepted=accepted, note=note, **({"correction": correction} if correction is not None else {}))
            _write_rows(Path(out) / INCREMENT, [r for _, r in rows])
            return row
    raise HarvestError(f"request '{request_id}' is not in the increment at {out}. Fix: pick a request_id from "
                       f"{INCREMENT}.")


def accept(out: Path | str) -> dict:
    """Write the accepted rows as a data source (chat records) and its provenance; undecided rows wait."""
    from mlops.files import atomic_write_json

    out = Path(out)
    records, decided = [], {"accepted": [], "rejected": [], "pending": []}
    feedback = []
    for number, row in read_increment(out):
        state = row.get("accepted")
        if state not in (True, False, None):
            raise HarvestError(f"{out / INCREMENT}, line {number}: accepted={state!r}; it must be true, false or "
                               "null. Nothing was written.")
        if state is True:
            records.append(_record(row, f"{out / INCREMENT}, line {number}"))
            feedback += row.get("feedback_ids") or []
        decided["accepted" if state else "pending" if state is None else "rejected"].append(row["request_id"])
    if not records:
        raise HarvestError(f"no row of {out / INCREMENT} is accepted ({len(decided['pending'])} pending, "
                           f"{len(decided['rejected'])} rejected). Fix: set \"accepted\": true on the rows to learn "
                           "from.")
    _write_rows(out / ACCEPTED, records)
    # Only what accepted.jsonl itself holds, so the source's hash (the build key) covers its provenance too.
    provenance = {"kind": "harvest", "requests": decided["accepted"], "feedback": feedback}
    atomic_write_json(out / (ACCEPTED + PROVENANCE_SUFFIX), provenance)
    return {"path": str(out / ACCEPTED), "accepted": len(records), "rejected": len(decided["rejected"]),
            "pending": len(decided["pending"])}


def _record(row: dict, where: str) -> dict:
    correction = row.get("correction")
    if not isinstance(correction, str) or not correction.strip():
        raise HarvestError(f"{where}: request {row['request_id']} is accepted but has no correction, and a bad "
                           "answer cannot be learned as it is. Nothing was written. Fix: write the right answer in "
                           "\"correction\", or set \"accepted\": false.")
    messages = [{"role": m["role"], "content": m["content"]} for m in row.get("messages") or []
                if m.get("role") in ("system", "user", "assistant")]
    if not messages or messages[-1]["role"] != "user":
        raise HarvestError(f"{where}: request {row['request_id']} has no user turn to answer. Fix: set "
                           "\"accepted\": false.")
    return {"messages": [*messages, {"role": "assistant", "content": correction.strip()}],
            "request_id": row["request_id"], "feedback_ids": row.get("feedback_ids") or []}


def _write_rows(path: Path, rows: list[dict]) -> None:
    from mlops.files import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))


def increment_config(cfg: Any, out: Path | str, *, history: str | None = None, ratio: float | None = None,
                     domain: str | None = None) -> Any:
    """`cfg` with the accepted source as its only source, the natural domain mix, and (when given) the history
    mix; validated."""
    from mlops.config import require_section, validate_config

    data = require_section(cfg, "data").model_dump(mode="json")
    source = Path(out) / ACCEPTED
    if not source.is_file():
        raise HarvestError(f"'{out}' holds no {ACCEPTED}. Fix: review the increment, then `mlops data harvest "
                           f"accept {out}`.")
    data["sources"] = [{"path": str(source.resolve()), **({"domain": domain} if domain else {})}]
    # What users corrected comes in whatever domains it comes in: the corpus's domain targets cannot hold for a
    # handful of corrections (the history mix brings the corpus's own mix back).
    data["mix"]["ratios"] = {}
    if history or ratio is not None:
        current = data["mix"].get("history") or {}
        snapshot = history or current.get("snapshot")
        if not snapshot:
            raise HarvestError("a history ratio was given without a history snapshot. Fix: pass --history "
                               "<snapshot id> (the snapshot the current model was trained on).")
        data["mix"]["history"] = {"snapshot": snapshot, "ratio": ratio if ratio is not None else 0.3}
    return validate_config({**cfg.model_dump(mode="json"), "data": data}, source="harvest")
