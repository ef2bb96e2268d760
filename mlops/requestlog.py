"""The request log, as MLflow traces: every served answer (PII-scrubbed), shadow answers and user feedback.

One served answer is one MLflow trace in the experiment `served-traffic` of the tracking store (the embedded
SQLite by default; `serve.request_log.database` or MLOPS_REQUEST_LOG_DB names another MLflow tracking URI). Its
tags (`mlops.model`, `mlops.version`, `mlops.role`, `mlops.key`, `mlops.engine`, `mlops.quantization`,
`mlops.status`, `mlops.parent_id`/`mlops.parent_trace` for a shadow answer) are what the Traces tab and
`mlflow.search_traces` filter on; latency, TTFT and tokens are trace metadata; the scrubbed prompt and answer are the
root span's inputs and outputs. Feedback (`POST /v1/feedback`) is assessments on the trace: the rating a feedback
named `rating` whose source is the sending key's name, a correction an expectation named `correction`.

The trace id is derived from the request id (`trace_id_of`), so a request id is logged once, migration reruns are
no-ops and feedback finds its trace without a search. This module is the one that talks to MLflow's tracing API,
as `mlops.tracking` is for runs. `read_requests` / `read_feedback` return plain rows (fields below) so readers
never see MLflow's types. `mlops.requestlog_migrate` moves the retired tables' rows into traces.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

DB_ENV = "MLOPS_REQUEST_LOG_DB"
EXPERIMENT = "served-traffic"
ROLES = ("user", "shadow", "canary")
TAG = "mlops."
PAGE = 500  # traces per search page
_TAG_FIELDS = ("request_id", "model", "version", "role", "route", "parent_id", "profile_hash", "key", "engine",
               "quantization")
_NUMBER_FIELDS = ("latency_ms", "ttft_ms", "tokens_in", "tokens_out")


@dataclass
class LoggedRequest:
    request_id: str
    model: str
    version: str
    route: str
    messages: list[dict]  # the prompt as chat messages (a completion prompt is one user message)
    response: str
    status: int = 200
    role: str = "user"
    parent_id: str | None = None  # for a shadow answer: the user's request it shadowed
    profile_hash: str | None = None
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    error: str | None = None
    ts: float = field(default_factory=time.time)
    key: str | None = None  # the sending API key's name (never the key); None when unauthenticated
    engine: str | None = None
    quantization: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Feedback:
    request_id: str
    rating: int  # -1 bad, 0 neutral, +1 good
    correction: str | None = None
    source: str | None = None  # the API key name or identity that sent it
    feedback_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ts: float = field(default_factory=time.time)


# --------------------------------------------------------------------------- the store


def log_url(explicit: str | None = None) -> str:
    """The tracking store that holds the traces: explicit, MLOPS_REQUEST_LOG_DB, else the tracking URI."""
    url = explicit or os.environ.get(DB_ENV, "").strip()
    if url:
        return url
    from mlops.tracking import tracking_uri

    return tracking_uri()


_STORES: dict[str, tuple[Any, str]] = {}


def store(url: str | None = None) -> tuple[Any, str]:
    """(MLflow tracing client, experiment id) of the store; the experiment is made on first use."""
    url = log_url(url)
    if url not in _STORES:
        from mlflow import MlflowClient
        from mlflow.tracing.client import TracingClient

        from mlops.tracking import ensure_experiment

        experiment_id = ensure_experiment(MlflowClient(tracking_uri=url), EXPERIMENT, url)
        _STORES[url] = (TracingClient(url), experiment_id)
    return _STORES[url]


def trace_id_of(request_id: str) -> str:
    """The trace id of a request id: stable, so a request is traced once and feedback needs no search."""
    return "tr-" + hashlib.sha256(request_id.encode()).hexdigest()[:32]


def scrub(text: str | None) -> str | None:
    """The data pipeline's PII scrubber, applied to anything the log stores."""
    if text is None:
        return None
    if not _SCRUBBER:
        from mlops.data.pii import DETECTORS, Scrubber

        _SCRUBBER.append(Scrubber(DETECTORS.names()))
    return _SCRUBBER[0].scrub(text)


_SCRUBBER: list = []


# --------------------------------------------------------------------------- writing


def scrubbed(r: LoggedRequest) -> LoggedRequest:
    """The row as the log may keep it: its prompt (resolved, when it is a callable), answer and error scrubbed.
    Scrubbing is idempotent, so a row scrubbed once (a spooled one) comes out the same."""
    messages = r.messages() if callable(r.messages) else r.messages
    return replace(r, messages=[{**m, "content": scrub(str(m.get("content", "")))} for m in messages],
                   response=scrub(r.response) or "", error=scrub(r.error))


def _trace(r: LoggedRequest, experiment_id: str):
    """(TraceInfo, root Span) of one answer, scrubbed."""
    from mlflow.entities import Span, TraceInfo, TraceLocation, TraceState

    trace_id = trace_id_of(r.request_id)
    clean = scrubbed(r)
    messages, response, error = clean.messages, clean.response, clean.error
    start_ns = int(r.ts * 1e9)
    end_ns = start_ns + int(max(r.latency_ms or 0.0, 0.0) * 1e6)
    ok = r.status < 400 and not error
    tags = {TAG + name: str(getattr(r, name))[:250] for name in _TAG_FIELDS if getattr(r, name) is not None}
    tags[TAG + "status"] = str(r.status)
    tags["mlflow.traceName"] = r.route.rsplit("/", 1)[-1]
    if r.parent_id is not None:
        tags[TAG + "parent_trace"] = trace_id_of(r.parent_id)
    metadata = {TAG + name: json.dumps(getattr(r, name)) for name in _NUMBER_FIELDS}
    metadata[TAG + "ts"] = repr(r.ts)
    metadata["mlflow.trace.tokenUsage"] = json.dumps({"input_tokens": r.tokens_in, "output_tokens": r.tokens_out,
                                                      "total_tokens": r.tokens_in + r.tokens_out})
    if error:
        metadata[TAG + "error"] = error[:4000]
    raw = bytes.fromhex(trace_id[3:])
    span = Span.from_dict({
        "trace_id": base64.b64encode(raw).decode(), "span_id": base64.b64encode(raw[:8]).decode(),
        "parent_span_id": None, "name": tags["mlflow.traceName"], "start_time_unix_nano": start_ns,
        "end_time_unix_nano": end_ns, "events": [], "links": [],
        "status": {"code": "STATUS_CODE_OK" if ok else "STATUS_CODE_ERROR", "message": "" if ok else (error or "")},
        "attributes": {"mlflow.traceRequestId": json.dumps(trace_id), "mlflow.spanType": json.dumps("CHAT_MODEL"),
                       "mlflow.spanInputs": json.dumps({"messages": messages}, ensure_ascii=False),
                       "mlflow.spanOutputs": json.dumps(response, ensure_ascii=False)},
    })
    info = TraceInfo(
        trace_id=trace_id, trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start_ns // 1_000_000, execution_duration=(end_ns - start_ns) // 1_000_000,
        state=TraceState.OK if ok else TraceState.ERROR, client_request_id=r.request_id,
        request_preview=(messages[-1]["content"] if messages else "")[:1000], response_preview=response[:1000],
        trace_metadata=metadata, tags=tags,
    )
    return info, span


SPANS_TAG = "mlflow.trace.spansLocation"  # MLflow sets it once a trace's spans are stored
COMPLETE = f"tag.`{SPANS_TAG}` IS NOT NULL"


def stored_traces(trace_ids: list[str], url: str | None = None) -> dict[str, bool]:
    """Which of these trace ids the store holds: trace id -> whether it is complete. A trace whose info was written
    but not its spans (the writer was killed between the two) is half written: writing its row again completes it."""
    client, experiment_id = store(url)
    found: dict[str, bool] = {}
    ids = list(dict.fromkeys(trace_ids))
    for start in range(0, len(ids), PAGE):
        chunk = ", ".join(f"'{i}'" for i in ids[start:start + PAGE])
        found |= {t.info.trace_id: SPANS_TAG in t.info.tags
                  for t in _search(client, experiment_id, f"request_id IN ({chunk})", spans=False)}
    return found


def existing_traces(trace_ids: list[str], url: str | None = None) -> set[str]:
    """Which of these trace ids the store holds complete."""
    return {tid for tid, complete in stored_traces(trace_ids, url).items() if complete}


def write_requests(rows: list[LoggedRequest], url: str | None = None) -> list[str]:
    """Write the rows as traces; returns the request ids skipped because their trace exists (a reused id). Writing
    a batch again is safe: its complete traces are skipped, its half-written ones completed."""
    if not rows:
        return []
    client, experiment_id = store(url)
    stored = stored_traces([trace_id_of(r.request_id) for r in rows], url)
    traces, skipped = [], []
    for r in rows:
        tid = trace_id_of(r.request_id)
        if stored.get(tid):
            skipped.append(r)
            continue
        traces.append((_trace(r, experiment_id), tid in stored))
        stored[tid] = True
    if traces:
        for (info, _), half_written in traces:  # the trace first: its spans then land on it (else MLflow merges)
            if not half_written:
                client.start_trace(info)
        client.log_spans(experiment_id, [span for (_, span), _ in traces])
    return [r.request_id for r in skipped]


def write_feedback(item: Feedback, url: str | None = None) -> None:
    """The rating as a feedback assessment from the sender, a correction as an expectation, on the trace."""
    from mlflow.entities import AssessmentSource, Expectation
    from mlflow.entities import Feedback as FeedbackAssessment

    client, _ = store(url)
    trace_id = trace_id_of(item.request_id)
    source = AssessmentSource(source_type="HUMAN", source_id=item.source or "anonymous")
    meta = {TAG + "feedback_id": item.feedback_id, TAG + "ts": repr(item.ts), TAG + "source": item.source or ""}
    client.log_assessment(trace_id, FeedbackAssessment(name="rating", value=item.rating, source=source,
                                                       metadata=meta, create_time_ms=int(item.ts * 1000)))
    if item.correction:
        client.log_assessment(trace_id, Expectation(name="correction", value=scrub(item.correction), source=source,
                                                    metadata=meta, create_time_ms=int(item.ts * 1000)))
    client.set_trace_tag(trace_id, TAG + "feedback", "yes")


# --------------------------------------------------------------------------- reading


def _search(client, experiment_id: str, filter_string: str | None, *, spans: bool = True, limit: int | None = None):
    """Every trace matching the filter, oldest first, page by page."""
    token, taken = None, 0
    while True:
        page = client.search_traces(locations=[experiment_id], filter_string=filter_string or None,
                                    max_results=min(PAGE, limit - taken) if limit else PAGE,
                                    order_by=["timestamp_ms ASC"], page_token=token, include_spans=spans)
        yield from page
        taken += len(page)
        token = page.token
        if not token or not page or (limit and taken >= limit):
            return


def _row(trace) -> dict:
    info = trace.info
    tags, meta = info.tags, info.trace_metadata
    row: dict[str, Any] = {name: tags.get(TAG + name) for name in _TAG_FIELDS}
    row["request_id"] = row["request_id"] or info.client_request_id
    row["status"] = int(tags.get(TAG + "status", 200))
    for name in _NUMBER_FIELDS:
        row[name] = json.loads(meta.get(TAG + name, "null"))
    row["error"] = meta.get(TAG + "error")
    row["ts"] = float(meta.get(TAG + "ts", info.request_time / 1000))
    row["trace_id"] = info.trace_id
    root = trace.data.spans[0] if trace.data and trace.data.spans else None
    inputs = (root.inputs if root is not None else None) or {}
    row["messages"] = inputs.get("messages", []) if isinstance(inputs, dict) else []
    row["response"] = (root.outputs if root is not None else None) or ""
    return row


def _filter(model, version, role, since) -> str:
    clauses = [f"tag.`{TAG}{name}` = '{_quoted(value)}'"
               for name, value in (("model", model), ("version", version), ("role", role)) if value is not None]
    if since is not None:
        clauses.append(f"timestamp_ms >= {int(since * 1000)}")
    return " AND ".join(clauses)


def _quoted(value: str) -> str:
    return str(value).replace("'", "''")


def read_requests(*, model: str | None = None, version: str | None = None, role: str | None = None,
                  since: float | None = None, parent_ids: list[str] | None = None, limit: int | None = None,
                  url: str | None = None, request_ids: list[str] | None = None) -> list[dict]:
    """Logged answers as rows (oldest first), read back from the traces through MLflow's search."""
    client, experiment_id = store(url)
    base = " AND ".join(filter(None, [_filter(model, version, role, since), COMPLETE]))  # half written: not yet
    if request_ids is not None:
        ids = [trace_id_of(r) for r in dict.fromkeys(request_ids)]
        traces = []
        for start in range(0, len(ids), PAGE):
            chunk = ", ".join(f"'{i}'" for i in ids[start:start + PAGE])
            traces += _search(client, experiment_id, " AND ".join(filter(None, [base, f"request_id IN ({chunk})"])))
        rows = sorted((_row(t) for t in traces), key=lambda r: r["ts"])
    elif parent_ids is not None:  # tags take no IN: the shadow answers, then theirs
        wanted = set(parent_ids)
        shadows = _search(client, experiment_id, " AND ".join(filter(None, [base, f"tag.`{TAG}parent_id` IS NOT NULL"])))
        rows = [r for r in map(_row, shadows) if r["parent_id"] in wanted]
    else:
        rows = [_row(t) for t in _search(client, experiment_id, base, limit=limit)]
    rows.sort(key=lambda r: r["ts"])  # the store orders by millisecond; the row keeps the exact time
    return rows[:limit] if limit else rows


def _feedback_rows(trace) -> list[dict]:
    """One row per feedback sent: the rating and its correction share a feedback id."""
    by_id: dict[str, dict] = {}
    request_id = trace.info.tags.get(TAG + "request_id") or trace.info.client_request_id
    for a in trace.info.assessments or []:
        meta = a.metadata or {}
        fid = meta.get(TAG + "feedback_id") or a.assessment_id
        row = by_id.setdefault(fid, {"request_id": request_id, "rating": 0, "correction": None,
                                     "source": meta.get(TAG + "source") or None, "feedback_id": fid,
                                     "ts": float(meta.get(TAG + "ts") or (a.create_time_ms or 0) / 1000)})
        if a.name == "rating" and a.feedback is not None:
            row["rating"] = int(a.feedback.value)
        elif a.name == "correction" and a.expectation is not None:
            row["correction"] = a.expectation.value
    return list(by_id.values())


def read_feedback(*, since: float | None = None, url: str | None = None,
                  request_ids: list[str] | None = None) -> list[dict]:
    """Feedback rows (oldest first) from the assessments on the traces."""
    client, experiment_id = store(url)
    rated = f"tag.`{TAG}feedback` = 'yes'"
    if request_ids is not None:
        ids = [trace_id_of(r) for r in dict.fromkeys(request_ids)]
        traces = []
        for start in range(0, len(ids), PAGE):
            chunk = ", ".join(f"'{i}'" for i in ids[start:start + PAGE])
            traces += _search(client, experiment_id, f"{rated} AND request_id IN ({chunk})", spans=False)
    else:
        traces = _search(client, experiment_id, rated, spans=False)
    rows = [row for t in traces for row in _feedback_rows(t) if since is None or row["ts"] >= since]
    return sorted(rows, key=lambda r: r["ts"])


def request_owner(request_id: str, url: str | None = None, roles: tuple[str, ...] | None = None) -> tuple[bool, str | None]:
    """(logged, the key name that sent it) for a request id; logged is False for other roles than `roles`."""
    from mlops.tracking import is_missing

    client, _ = store(url)
    try:
        info = client.get_trace_info(trace_id_of(request_id))
    except Exception as err:
        if is_missing(err):
            return False, None
        raise
    if roles is not None and info.tags.get(TAG + "role") not in roles:
        return False, None
    return True, info.tags.get(TAG + "key")


def known_request(request_id: str, url: str | None = None, roles: tuple[str, ...] | None = None) -> bool:
    """A trace for this request id exists (of one of `roles`, when given)."""
    return request_owner(request_id, url, roles)[0]


def prune(older_than_days: float, url: str | None = None) -> int:
    """Retention: delete traces (their assessments with them) older than the given age; returns traces removed."""
    client, experiment_id = store(url)
    cut_ms = int((time.time() - older_than_days * 86400) * 1000)
    return client.delete_traces(experiment_id, max_timestamp_millis=cut_ms, max_traces=100000) or 0
