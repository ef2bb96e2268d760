"""Layer 3 (storage): the registry's database: where it is, one engine per URL, and its failures in plain words.

The ledger (`registry.ledger`), the attestations (`registry.attest_store`), the freshness timestamps
(`registry.freshness`) and the spot-checks live in one database: the MLflow backend store's (the embedded SQLite
file, or PostgreSQL) by default; `MLOPS_REGISTRY_DB` names another one, and is required when the tracking URI is
a server. Nothing here reads an entry.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any

from mlops.errors import MLOpsError, NotFoundError

DB_ENV = "MLOPS_REGISTRY_DB"
BOOTSTRAP_FIX = "Fix: the first admin creates the registry once with `mlops registry bootstrap --admin <name>`."


class LedgerError(MLOpsError):
    """The ledger database cannot be used (unreachable, locked, misconfigured, refusing a write)."""


class NoRegistry(NotFoundError):
    """The store exists but holds no registry (never bootstrapped)."""


class LedgerBroken(MLOpsError):
    """The chain does not verify: nothing that decides anything may trust it."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        more = f" ({len(problems) - 1} more problem(s): `mlops registry verify`)" if len(problems) > 1 else ""
        super().__init__(f"the release ledger does not verify: {problems[0]}{more}. Nothing was changed and no "
                         "release decision is taken from it. Fix: restore the ledger database from a backup (or "
                         "investigate who wrote it); serving stays on the last verified version.")


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


def display(url: str) -> str:
    from mlops.tracking import display_uri

    return display_uri(url)


_ENGINES: dict[str, Any] = {}
# Per process, at most: an act's transaction and a read that a gate makes inside it (the spot-check tables), one more
# for reads beside it; the act lock has a connection of its own (`lock_engine`). 20 processes at once stay below
# PostgreSQL's default max_connections (100).
POOL_SIZE, POOL_OVERFLOW = 2, 1


def engine(url: str | None = None, *, create: bool = False):
    """One SQLAlchemy engine per URL. A SQLite file that is not there is never created, except by `create`."""
    url = ledger_url(url)
    if url in _ENGINES:
        return _ENGINES[url]
    import sqlalchemy as sa

    if url.startswith("sqlite"):
        _require_sqlite_file(url, create)
        busy = float(os.environ.get("MLOPS_SQLITE_BUSY_TIMEOUT", "30"))  # seconds a writer waits for the lock
        eng = sa.create_engine(url, connect_args={"timeout": busy, "isolation_level": None},
                               poolclass=sa.pool.NullPool)

        @sa.event.listens_for(eng, "begin")
        def _immediate(conn):  # take SQLite's write lock at BEGIN: appends never interleave
            conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        eng = sa.create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW,
                               pool_timeout=60, connect_args={"connect_timeout": 10})
    _ENGINES[url] = eng
    return eng


_LOCKERS: dict[str, Any] = {}


def lock_engine(url: str):
    """Where a PostgreSQL act takes its advisory lock: a connection of its own, outside the pool, so acts that
    wait for the lock never hold a pooled connection that the act holding it needs."""
    if url not in _LOCKERS:
        import sqlalchemy as sa

        _LOCKERS[url] = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 10})
    return _LOCKERS[url]


_READERS: dict[str, Any] = {}


def reader(url: str | None = None):
    """The engine reads go through: on SQLite one without BEGIN IMMEDIATE, so readers never queue behind (or
    block) the writer; elsewhere the writer's own pool."""
    url = ledger_url(url)
    eng = engine(url)
    if eng.dialect.name != "sqlite":
        return eng
    if url not in _READERS:
        import sqlalchemy as sa

        busy = float(os.environ.get("MLOPS_SQLITE_BUSY_TIMEOUT", "30"))
        _READERS[url] = sa.create_engine(url, connect_args={"timeout": busy, "isolation_level": None},
                                         poolclass=sa.pool.NullPool)
    return _READERS[url]


def _require_sqlite_file(url: str, create: bool) -> None:
    from pathlib import Path

    path = url.split("///", 1)[-1] if "///" in url else ""
    if not path or path == ":memory:" or Path(path).exists():
        return
    if create:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return
    raise NotFoundError(f"the registry store {path} does not exist (nothing was created). Fix: check "
                        f"MLFLOW_TRACKING_URI / {DB_ENV}, or create the registry there with `mlops registry "
                        "bootstrap --admin <name>`.")


@contextmanager
def db_errors(url: str, doing: str = "read"):
    """Any database failure as one paragraph naming the store and the fix; nothing half-written survives it."""
    import sqlalchemy as sa

    try:
        yield
    except sa.exc.SQLAlchemyError as err:
        raise _db_error(err, url, doing) from None


def _db_error(err: BaseException, url: str, doing: str) -> MLOpsError:
    import sqlalchemy as sa

    first = (str(getattr(err, "orig", None) or err).strip().splitlines() or [type(err).__name__])[0][:300]
    if _missing_table(err):
        return NoRegistry(f"the store {display(url)} holds no release registry (no ledger tables). "
                          f"{BOOTSTRAP_FIX}")
    if isinstance(err, sa.exc.OperationalError | sa.exc.InterfaceError | sa.exc.TimeoutError):
        return LedgerError(f"the ledger database {display(url)} cannot be used ({type(err).__name__}: {first}). "
                           "Nothing was changed. Fix: check that the database is up and not locked by another "
                           "process, then retry.")
    return LedgerError(f"the ledger database {display(url)} refused the {doing} ({type(err).__name__}: {first}). "
                       "Nothing was changed. Fix: correct the value it names, or check the database, then retry.")


def _missing_table(err: BaseException) -> bool:
    text = str(getattr(err, "orig", None) or err).lower()
    return ("no such table" in text or "does not exist" in text and "relation" in text) and "mlops_" in text
