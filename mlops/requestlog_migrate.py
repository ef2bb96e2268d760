"""Move the retired request-log tables (`mlops_request_log`, `mlops_feedback`) into MLflow traces, then drop them.

Before traces, serving wrote answers and feedback into two tables of its own in the registry's database. `migrate`
writes every answer as a trace (`mlops.requestlog.write_requests`: a request id already traced is skipped, so a
rerun writes nothing twice) and every feedback as assessments (a feedback id already on its trace is skipped),
checks that each row can be read back through MLflow, and only then drops the tables: nothing is lost if it stops
half-way, and a rerun after the drop finds nothing to do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlops.errors import MLOpsError

LEGACY_TABLES = ("mlops_feedback", "mlops_request_log")  # dropped in this order (feedback names requests)
CHUNK = 500


class MigrationError(MLOpsError):
    """The tables could not be moved completely; they were kept."""


def legacy_url(explicit: str | None = None) -> str:
    """Where the tables lived: explicit, MLOPS_REQUEST_LOG_DB, MLOPS_REGISTRY_DB, else the tracking database."""
    for url in (explicit, os.environ.get("MLOPS_REQUEST_LOG_DB", ""), os.environ.get("MLOPS_REGISTRY_DB", "")):
        if url and url.strip():
            return url.strip()
    from mlops.tracking import tracking_uri

    uri = tracking_uri()
    if uri.startswith(("http://", "https://")):
        raise MigrationError(f"the tracking URI {uri} is a server, so the old tables' database must be named. Fix: "
                             "pass --from postgresql+psycopg://user@host:5432/mlflow (or set MLOPS_REGISTRY_DB).")
    return uri


def migrate(source: str | None = None, url: str | None = None) -> dict:
    """Copy the tables at `source` into traces at `url` (the request log's store), verify, drop; returns counts."""
    import sqlalchemy as sa

    nothing = {"requests": 0, "already_traced": 0, "feedback": 0, "orphaned_feedback": 0, "dropped": []}
    url_from = legacy_url(source)
    if url_from.startswith("sqlite:///") and not Path(url_from.removeprefix("sqlite:///")).exists():
        return nothing  # no database, so no tables to move
    engine = sa.create_engine(url_from)
    try:
        try:
            present = set(sa.inspect(engine).get_table_names()) & set(LEGACY_TABLES)
        except sa.exc.OperationalError as err:
            raise MigrationError(f"--from {url_from}: the old tables' database could not be opened "
                                 f"({str(err).splitlines()[0][:200]}). Fix: name a reachable database with --from "
                                 "(or MLOPS_REGISTRY_DB).") from None
        if not present:
            return nothing
        meta = sa.MetaData()
        tables = {name: sa.Table(name, meta, autoload_with=engine) for name in present}
        counts = {"requests": 0, "already_traced": 0, "feedback": 0, "orphaned_feedback": 0}
        if "mlops_request_log" in tables:
            _move_requests(engine, tables["mlops_request_log"], url, counts)
        if "mlops_feedback" in tables:
            _move_feedback(engine, tables["mlops_feedback"], url, counts)
        with engine.begin() as conn:
            for name in LEGACY_TABLES:
                if name in tables:
                    tables[name].drop(conn)
        return {**counts, "dropped": [name for name in LEGACY_TABLES if name in tables]}
    finally:
        engine.dispose()


def _rows(engine, table):
    import sqlalchemy as sa

    with engine.connect() as conn:
        result = conn.execute(sa.select(table).order_by(table.c.ts)).mappings()
        while chunk := result.fetchmany(CHUNK):
            yield [dict(r) for r in chunk]


def _move_requests(engine, table, url, counts: dict) -> None:
    from mlops.requestlog import LoggedRequest, existing_traces, trace_id_of, write_requests

    fields = set(LoggedRequest.__dataclass_fields__)
    for chunk in _rows(engine, table):
        rows = [LoggedRequest(**{**{k: v for k, v in r.items() if k in fields}, "messages": json.loads(r["messages"]),
                                 "response": r["response"] or ""}) for r in chunk]
        skipped = write_requests(rows, url)
        counts["requests"] += len(rows) - len(skipped)
        counts["already_traced"] += len(skipped)
        missing = {trace_id_of(r.request_id) for r in rows} - existing_traces([trace_id_of(r.request_id)
                                                                                for r in rows], url)
        if missing:
            raise MigrationError(f"{len(missing)} requests could not be read back as traces after writing them; the "
                                 "tables were kept. Fix: check the tracking store, then run the migration again.")


def _move_feedback(engine, table, url, counts: dict) -> None:
    from mlops.requestlog import Feedback, existing_traces, read_feedback, trace_id_of, write_feedback

    for chunk in _rows(engine, table):
        ids = [r["request_id"] for r in chunk]
        done = {f["feedback_id"] for f in read_feedback(request_ids=ids, url=url)}
        traced = existing_traces([trace_id_of(i) for i in ids], url)
        for r in chunk:
            if r["feedback_id"] in done:
                continue
            if trace_id_of(r["request_id"]) not in traced:  # its request was pruned: nothing left to rate
                counts["orphaned_feedback"] += 1
                continue
            write_feedback(Feedback(r["request_id"], int(r["rating"]), correction=r["correction"],
                                    source=r["source"], feedback_id=r["feedback_id"], ts=float(r["ts"])), url)
            counts["feedback"] += 1
