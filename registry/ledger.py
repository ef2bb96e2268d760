"""The release ledger: append-only, hash-chained, in the MLflow backend's database but in tables of its own.

Every registration, request, approval, rejection, transition, override, rollback and reconcile is one entry:
who, when (UTC), model, version, stage from -> to, alias before -> after, evidence refs, reason. Each entry stores
the hash of the one before it, and a one-row head table holds the newest hash, so an edited, inserted or deleted
entry breaks the chain where it happened (`verify`). Tables are created by this module (`mlops_ledger`,
`mlops_ledger_head`), never inside MLflow's schema or migrations.

Where it lives: the database of the MLflow backend store (the embedded SQLite file, or PostgreSQL) by default;
`MLOPS_REGISTRY_DB` (or `registry.db`) names another one, and is required when the tracking URI is a server.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from mlops.errors import MLOpsError

DB_ENV = "MLOPS_REGISTRY_DB"
GENESIS = "0" * 64
FIELDS = ("seq", "ts", "actor", "action", "model", "version", "from_stage", "to_stage", "alias", "alias_before",
          "alias_after", "evidence", "reason", "prev_hash")


class LedgerError(MLOpsError):
    """The ledger database cannot be used (unreachable, locked, misconfigured)."""


@dataclass(frozen=True)
class Entry:
    seq: int
    ts: str
    actor: str
    action: str
    model: str
    version: str | None = None
    from_stage: str | None = None
    to_stage: str | None = None
    alias: str | None = None
    alias_before: str | None = None
    alias_after: str | None = None
    evidence: dict = field(default_factory=dict)
    reason: str | None = None
    prev_hash: str = GENESIS
    hash: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def entry_hash(values: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of an entry's fields (its own hash excluded)."""
    body = {k: values.get(k) for k in FIELDS}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def utc_now() -> str:
    ns = time.time_ns()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{(ns // 1000) % 10**6:06d}Z"


def ledger_url(explicit: str | None = None) -> str:
    """The ledger's SQLAlchemy URL: explicit, MLOPS_REGISTRY_DB, or the MLflow backend store's database."""
    from mlops.tracking import tracking_uri

    url = explicit or os.environ.get(DB_ENV, "").strip()
    if url:
        return url
    uri = tracking_uri()
    if uri.startswith(("http://", "https://")):
        raise LedgerError(
            f"the tracking URI {uri} is a server, so the ledger's database must be named. Fix: set {DB_ENV} to "
            "the SQLAlchemy URL of the tracking server's backend database (e.g. "
            "postgresql+psycopg://user@host:5432/mlflow) or registry.db in the config."
        )
    if uri.startswith(("file:", "/")) or "://" not in uri:
        raise LedgerError(f"the tracking URI {uri} is a file store, which has no database for the ledger. Fix: use "
                          f"a sqlite:/// or postgresql:// tracking URI, or set {DB_ENV}.")
    return uri


_ENGINES: dict[str, Any] = {}


def engine(url: str | None = None):
    """One SQLAlchemy engine per URL, with the ledger's tables created (idempotent, race-safe)."""
    url = ledger_url(url)
    if url in _ENGINES:
        return _ENGINES[url]
    import sqlalchemy as sa

    if url.startswith("sqlite"):
        if url.startswith("sqlite:///"):
            from pathlib import Path

            from mlops.paths import mlops_dir

            folder = Path(url.removeprefix("sqlite:///")).parent
            if folder == mlops_dir():  # the embedded default's folder; a named database must already be there
                folder.mkdir(parents=True, exist_ok=True)
        busy = float(os.environ.get("MLOPS_SQLITE_BUSY_TIMEOUT", "30"))  # seconds a writer waits for the lock
        eng = sa.create_engine(url, connect_args={"timeout": busy, "isolation_level": None},
                               poolclass=sa.pool.NullPool)

        @sa.event.listens_for(eng, "begin")
        def _immediate(conn):  # take SQLite's write lock at BEGIN: appends never interleave
            conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        eng = sa.create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})
    try:
        create_tables(eng)
    except sa.exc.SQLAlchemyError as err:
        raise unreachable(err, url) from err
    _ENGINES[url] = eng
    return eng


def unreachable(err: BaseException, url: str) -> LedgerError:
    from mlops.tracking import display_uri

    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    return LedgerError(
        f"the ledger database {display_uri(url)} cannot be used ({type(err).__name__}: {first}). Nothing was "
        f"changed. Fix: check that the database is up and not locked by another process, then retry."
    )


def _tables():
    import sqlalchemy as sa

    meta = sa.MetaData()
    ledger = sa.Table(
        "mlops_ledger", meta,
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("ts", sa.String(40), nullable=False),
        sa.Column("actor", sa.String(80), nullable=False),
        sa.Column("action", sa.String(40), nullable=False),
        sa.Column("model", sa.String(256), nullable=False, index=True),
        sa.Column("version", sa.String(40)),
        sa.Column("from_stage", sa.String(40)),
        sa.Column("to_stage", sa.String(40)),
        sa.Column("alias", sa.String(80)),
        sa.Column("alias_before", sa.String(40)),
        sa.Column("alias_after", sa.String(40)),
        sa.Column("evidence", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    head = sa.Table(
        "mlops_ledger_head", meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    return meta, ledger, head


META, LEDGER, HEAD = _tables()


def create_tables(eng) -> None:
    import sqlalchemy as sa

    for attempt in range(5):
        try:
            META.create_all(eng, checkfirst=True)
            with eng.begin() as conn:
                if conn.execute(sa.select(HEAD.c.id)).first() is None:
                    conn.execute(HEAD.insert().values(id=1, seq=0, hash=GENESIS))
            return
        except sa.exc.IntegrityError:
            return  # another process created the head row first
        except sa.exc.ProgrammingError:
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))  # concurrent CREATE TABLE on PostgreSQL: retry, it exists now


@contextmanager
def locked(url: str | None = None):
    """A transaction holding the ledger's write lock (head row FOR UPDATE; BEGIN IMMEDIATE on SQLite).

    Yields (connection, head_seq, head_hash). Whatever the caller appends commits with it, or not at all.
    """
    import sqlalchemy as sa

    eng = engine(url)
    try:
        with eng.begin() as conn:
            query = sa.select(HEAD.c.seq, HEAD.c.hash).where(HEAD.c.id == 1)
            if eng.dialect.name == "postgresql":
                query = query.with_for_update()
            seq, head_hash = conn.execute(query).one()
            yield conn, seq, head_hash
    except sa.exc.OperationalError as err:
        raise unreachable(err, str(eng.url)) from err


def append(conn, head_seq: int, head_hash: str, **values: Any) -> Entry:
    """Append one entry inside a `locked()` transaction; returns it with its hash."""

    evidence = values.pop("evidence", None) or {}
    row = {k: values.get(k) for k in FIELDS if k not in ("seq", "prev_hash", "evidence")}
    row.update(seq=head_seq + 1, prev_hash=head_hash, ts=values.get("ts") or utc_now(), evidence=evidence)
    row["version"] = None if row.get("version") is None else str(row["version"])
    digest = entry_hash(row)
    conn.execute(LEDGER.insert().values(**{**row, "evidence": json.dumps(evidence, sort_keys=True)}, hash=digest))
    conn.execute(HEAD.update().where(HEAD.c.id == 1).values(seq=row["seq"], hash=digest))
    return Entry(**{**row, "hash": digest})


def entries(model: str | None = None, url: str | None = None) -> list[Entry]:
    """Every entry (of one model), oldest first."""
    import sqlalchemy as sa

    eng = engine(url)
    query = sa.select(LEDGER).order_by(LEDGER.c.seq)
    if model is not None:
        query = query.where(LEDGER.c.model == model)
    try:
        with eng.connect() as conn:
            rows = conn.execute(query).mappings().all()
    except sa.exc.OperationalError as err:
        raise unreachable(err, str(eng.url)) from err
    return [_entry(r) for r in rows]


def _entry(row) -> Entry:
    data = dict(row)
    data["evidence"] = json.loads(data["evidence"]) if data.get("evidence") else {}
    return Entry(**data)


def head(url: str | None = None) -> tuple[int, str]:
    import sqlalchemy as sa

    with engine(url).connect() as conn:
        return tuple(conn.execute(sa.select(HEAD.c.seq, HEAD.c.hash).where(HEAD.c.id == 1)).one())


def chain_problems(all_entries: list[Entry], head_seq: int, head_hash: str) -> list[str]:
    """Where the chain breaks: an edited entry, a gap (deleted or inserted), or a head that disagrees."""
    problems = []
    prev = GENESIS
    expected_seq = 1
    for e in all_entries:
        if e.seq != expected_seq:
            problems.append(f"entry {e.seq}: expected entry {expected_seq} here (an entry was deleted or inserted)")
            expected_seq = e.seq
        if e.prev_hash != prev:
            problems.append(f"entry {e.seq}: its prev_hash does not match entry {e.seq - 1}'s hash "
                            "(an entry before it was edited, deleted or inserted)")
        if entry_hash(e.as_dict()) != e.hash:
            problems.append(f"entry {e.seq} ({e.action} {e.model} v{e.version} by {e.actor}): its content does not "
                            "match its hash (it was edited)")
        prev = e.hash
        expected_seq += 1
    last_seq = all_entries[-1].seq if all_entries else 0
    if (last_seq, prev) != (head_seq, head_hash):
        problems.append(f"the ledger ends at entry {last_seq} but its head records entry {head_seq}: entries after "
                        f"{last_seq} were deleted, or the head was edited")
    return problems
