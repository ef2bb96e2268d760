"""The request log: every served request and response (PII-scrubbed), shadow answers, and user feedback.

It lives in the registry's database (the ledger's: the MLflow backend database by default, `MLOPS_REGISTRY_DB`
to move it, `MLOPS_REQUEST_LOG_DB` for a store of its own) in tables of its own. Serving writes it; shadow reports,
spot-checks and `mlops data harvest` read it. Texts are scrubbed with the data pipeline's PII scrubber before they
are stored, so the log never holds what a snapshot may not.

Rows: `mlops_request_log` (one per answer: the user's, and a shadow's with `role='shadow'` and `parent_id` set)
and `mlops_feedback` (rating -1/0/+1 and an optional correction, keyed by request id).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

DB_ENV = "MLOPS_REQUEST_LOG_DB"
ROLES = ("user", "shadow", "canary")


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


def _tables():
    import sqlalchemy as sa

    meta = sa.MetaData()
    requests = sa.Table(
        "mlops_request_log", meta,
        sa.Column("request_id", sa.String(80), primary_key=True),
        sa.Column("ts", sa.Float, nullable=False, index=True),
        sa.Column("model", sa.String(256), nullable=False, index=True),
        sa.Column("version", sa.String(40), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("parent_id", sa.String(80), index=True),
        sa.Column("route", sa.String(80), nullable=False),
        sa.Column("profile_hash", sa.String(40)),
        sa.Column("messages", sa.Text, nullable=False),
        sa.Column("response", sa.Text, nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("latency_ms", sa.Float),
        sa.Column("ttft_ms", sa.Float),
        sa.Column("tokens_in", sa.Integer),
        sa.Column("tokens_out", sa.Integer),
    )
    feedback = sa.Table(
        "mlops_feedback", meta,
        sa.Column("feedback_id", sa.String(40), primary_key=True),
        sa.Column("request_id", sa.String(80), nullable=False, index=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("rating", sa.Integer, nullable=False),
        sa.Column("correction", sa.Text),
        sa.Column("source", sa.String(120)),
    )
    return meta, requests, feedback


META, REQUESTS, FEEDBACK = _tables()
_ENGINES: dict[str, Any] = {}


def log_url(explicit: str | None = None) -> str:
    """The request log's database: explicit, MLOPS_REQUEST_LOG_DB, else the registry's (the ledger's) database."""
    url = explicit or os.environ.get(DB_ENV, "").strip()
    if url:
        return url
    registry_db = os.environ.get("MLOPS_REGISTRY_DB", "").strip()
    if registry_db:
        return registry_db
    from mlops.tracking import tracking_uri

    uri = tracking_uri()
    if uri.startswith(("http://", "https://")):
        from mlops.errors import ConfigError

        raise ConfigError(f"the tracking URI {uri} is a server, so the request log's database must be named. Fix: "
                          f"set {DB_ENV} (or MLOPS_REGISTRY_DB) to a SQLAlchemy URL such as "
                          "postgresql+psycopg://user@host:5432/mlflow.")
    return uri


def engine(url: str | None = None):
    import sqlalchemy as sa

    url = log_url(url)
    if url not in _ENGINES:
        if url.startswith("sqlite:///"):
            from pathlib import Path

            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        kwargs = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {"pool_pre_ping": True}
        eng = sa.create_engine(url, **kwargs)
        META.create_all(eng, checkfirst=True)
        _ENGINES[url] = eng
    return _ENGINES[url]


def scrub(text: str | None) -> str | None:
    """The data pipeline's PII scrubber, applied to anything the log stores."""
    if text is None:
        return None
    if not _SCRUBBER:
        from mlops.data.pii import DETECTORS, Scrubber

        _SCRUBBER.append(Scrubber(DETECTORS.names()))
    return _SCRUBBER[0].scrub(text)


_SCRUBBER: list = []


def _row(r: LoggedRequest) -> dict:
    row = r.as_dict()
    row["messages"] = json.dumps([{**m, "content": scrub(str(m.get("content", "")))} for m in r.messages],
                                 ensure_ascii=False)
    row["response"] = scrub(r.response) or ""
    row["error"] = scrub(r.error)
    return row


def write_requests(rows: list[LoggedRequest], url: str | None = None) -> None:
    if not rows:
        return
    with engine(url).begin() as conn:
        conn.execute(REQUESTS.insert(), [_row(r) for r in rows])


def write_feedback(item: Feedback, url: str | None = None) -> None:
    with engine(url).begin() as conn:
        row = asdict(item)
        row["correction"] = scrub(item.correction)
        conn.execute(FEEDBACK.insert().values(**row))


def read_requests(*, model: str | None = None, version: str | None = None, role: str | None = None,
                  since: float | None = None, parent_ids: list[str] | None = None, limit: int | None = None,
                  url: str | None = None, request_ids: list[str] | None = None) -> list[dict]:
    import sqlalchemy as sa

    query = sa.select(REQUESTS).order_by(REQUESTS.c.ts)
    for column, value in (("model", model), ("version", version), ("role", role)):
        if value is not None:
            query = query.where(REQUESTS.c[column] == value)
    if since is not None:
        query = query.where(REQUESTS.c.ts >= since)
    if limit:
        query = query.limit(limit)
    rows: list[dict] = []
    with engine(url).connect() as conn:
        for column, ids in (("parent_id", parent_ids), ("request_id", request_ids)):
            if ids is not None:
                rows = _by_ids(conn, query, REQUESTS.c[column], ids)
                break
        else:
            rows = [dict(r) for r in conn.execute(query).mappings()]
    for row in rows:
        row["messages"] = json.loads(row["messages"])
    return rows


def _by_ids(conn, query, column, ids: list[str], chunk: int = 500) -> list[dict]:
    """Rows whose `column` is in `ids`, in chunks (a database caps the parameters of one statement)."""
    ids = list(dict.fromkeys(ids))
    rows = []
    for start in range(0, len(ids), chunk):
        rows += [dict(r) for r in conn.execute(query.where(column.in_(ids[start:start + chunk]))).mappings()]
    return sorted(rows, key=lambda r: r["ts"])


def read_feedback(*, since: float | None = None, url: str | None = None,
                  request_ids: list[str] | None = None) -> list[dict]:
    import sqlalchemy as sa

    query = sa.select(FEEDBACK).order_by(FEEDBACK.c.ts)
    if since is not None:
        query = query.where(FEEDBACK.c.ts >= since)
    with engine(url).connect() as conn:
        if request_ids is not None:
            return _by_ids(conn, query, FEEDBACK.c.request_id, request_ids)
        return [dict(r) for r in conn.execute(query).mappings()]


def known_request(request_id: str, url: str | None = None, roles: tuple[str, ...] | None = None) -> bool:
    """A row with this id exists (of one of `roles`, when given)."""
    import sqlalchemy as sa

    query = sa.select(REQUESTS.c.request_id).where(REQUESTS.c.request_id == request_id)
    if roles is not None:
        query = query.where(REQUESTS.c.role.in_(roles))
    with engine(url).connect() as conn:
        return conn.execute(query).first() is not None


def prune(older_than_days: float, url: str | None = None) -> int:
    """Retention: delete requests (and their feedback) older than the given age; returns rows removed."""
    import sqlalchemy as sa

    cut = time.time() - older_than_days * 86400
    with engine(url).begin() as conn:
        old = sa.select(REQUESTS.c.request_id).where(REQUESTS.c.ts < cut)
        conn.execute(FEEDBACK.delete().where(FEEDBACK.c.request_id.in_(old)))
        return conn.execute(REQUESTS.delete().where(REQUESTS.c.ts < cut)).rowcount
