"""Layer 3 (storage): the release ledger, an append-only signed hash chain in tables of its own.

Every registration, request, approval, rejection, transition, override, rollback, reconcile, package and
governance act (identities, keys, release policy) is one entry: who, when (UTC), model, version, stage from -> to,
alias before -> after, evidence, reason. Each entry's hash covers its fields and the hash before it
(`registry.entries`), and the acting person's own Ed25519 key signs it (`registry.signing`). A verifier holds only
public keys and the pinned root (`registry.trust`), and replays every rule on every entry (`registry.rules`). So an
edited, inserted, deleted or cut-off entry, an entry signed by a key that is not its actor's, and a validly signed
entry that breaks a rule all stop `verified()`, which every read that decides something goes through, naming the
first bad entry.

Tables (`mlops_ledger`, `mlops_ledger_head`, `mlops_registry`) are created once by `mlops registry bootstrap`,
never inside MLflow's schema or migrations, and never by a read.

Where it lives: the database of the MLflow backend store (the embedded SQLite file, or PostgreSQL) by default;
`MLOPS_REGISTRY_DB` (or `registry.db`) names another one, and is required when the tracking URI is a server.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from mlops.errors import MLOpsError, NotFoundError
from registry.entries import FIELDS, GENESIS, Entry, canonical, entry_hash  # noqa: F401 - the ledger's vocabulary
from registry.rules import RefusedError, World, advance, problem, signature_problem
from registry.signing import Signer, statement

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
        sa.Column("signature", sa.String(128)),  # an unsigned row is refused by every verifier
    )
    head = sa.Table(
        "mlops_ledger_head", meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    registry = sa.Table(
        "mlops_registry", meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("registry_id", sa.String(64), nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
    )
    return meta, ledger, head, registry


META, LEDGER, HEAD, REGISTRY = _tables()


def create_registry(url: str | None = None) -> str:
    """The tables and the registry's id (bootstrap only); refuses a store that has a registry."""
    import sqlalchemy as sa

    url = ledger_url(url)
    eng = engine(url, create=True)
    registry_id = uuid.uuid4().hex
    with db_errors(url, "bootstrap"):
        META.create_all(eng, checkfirst=True)
        try:
            with eng.begin() as conn:
                conn.execute(REGISTRY.insert().values(id=1, registry_id=registry_id, created=utc_now()))
                conn.execute(HEAD.insert().values(id=1, seq=0, hash=GENESIS))
        except sa.exc.IntegrityError:
            raise MLOpsError(f"the store {display(url)} already holds a registry: it is bootstrapped once. Fix: "
                             "act as its admin (`mlops registry user add ...`).") from None
    return registry_id


@dataclass
class Chain:
    """A verified view of the whole ledger (or a write transaction's view of it), with the world it replays to."""

    registry_id: str
    root: str
    entries: list[Entry]
    head_seq: int
    head_hash: str
    world: World | None = field(default=None, repr=False)

    def of(self, model: str) -> list[Entry]:
        return [e for e in self.entries if e.model == model]


def registry_id_of(conn, url: str) -> str:
    import sqlalchemy as sa

    from registry.trust import check_registry_id

    found = conn.execute(sa.select(REGISTRY.c.registry_id).where(REGISTRY.c.id == 1)).first()
    if found is None:
        raise NoRegistry(f"the store {display(url)} holds no release registry. {BOOTSTRAP_FIX}")
    return check_registry_id(found[0], display(url))


def read_chain(conn, url: str, *, for_update: bool = False) -> Chain:
    import sqlalchemy as sa

    from registry.trust import pinned_root

    registry_id = registry_id_of(conn, url)
    root = pinned_root(registry_id, display(url))
    query = sa.select(HEAD.c.seq, HEAD.c.hash).where(HEAD.c.id == 1)
    if for_update and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    seq, head_hash = conn.execute(query).one()
    rows = conn.execute(sa.select(LEDGER).order_by(LEDGER.c.seq)).mappings().all()
    chain = Chain(registry_id, root, [_entry(r) for r in rows], seq, head_hash)
    chain.url = url  # where its timestamps and attestations are read (registry.freshness)
    return chain


# The world after the longest prefix this process audited (signatures and rules), keyed by registry and root: a
# read re-checks every hash and link (cheap), then audits only the entries after that prefix. The hash chain makes
# a prefix with the same last hash the same entries, byte for byte. A cached world is never changed in place (other
# threads may hold it): new entries are applied to a copy, which then becomes the cached one.
_AUDITED: dict[tuple[str, str], tuple[int, str, World]] = {}
_AUDIT_LOCK = threading.Lock()


def audited(chain: Chain) -> list[str]:
    """Signatures and rules of every entry; sets `chain.world` (the state after them) when they all hold."""
    import copy

    key = (chain.registry_id, chain.root)
    with _AUDIT_LOCK:
        n, last, cached = _AUDITED.get(key, (0, GENESIS, None))
    if cached is None or n > len(chain.entries) or (n and chain.entries[n - 1].hash != last):
        n, world = 0, World()
    else:
        world = cached if n == len(chain.entries) else copy.deepcopy(cached)
    problems = []
    for e in chain.entries[n:]:
        bad = signature_problem(world, e, chain.registry_id, chain.root) or problem(world, e)
        if bad:
            problems.append(f"entry {e.seq} ({e.action} {e.model} v{e.version} by {e.actor}): {bad}")
        advance(world, e)
    if problems:
        return problems
    if chain.entries and world is not cached:
        with _AUDIT_LOCK:
            _AUDITED[key] = (len(chain.entries), chain.entries[-1].hash, world)
    chain.world = world
    return []


def verified(url: str | None = None) -> Chain:
    """The whole ledger, verified (hashes, links, head, pinned head and anchor, signatures, every rule)."""
    url = ledger_url(url)
    with db_errors(url), reader(url).connect() as conn:
        chain = read_chain(conn, url)
    check(chain)
    return chain


def problems_of(chain: Chain, *, fresh: bool = True) -> list[str]:
    """Everything wrong with the chain; with `fresh`, also a missing or stale signed timestamp where the recorded
    policy sets registry.freshness.hours (`registry.freshness`)."""
    from registry.freshness import problems as stale
    from registry.trust import pinned_head, read_anchor

    problems = chain_problems(chain.entries, chain.head_seq, chain.head_hash, read_anchor(chain.registry_id),
                              pinned_head())
    problems = problems or audited(chain)
    return problems if problems or not fresh else stale(chain)


def check(chain: Chain) -> None:
    from registry.freshness import StaleLedger
    from registry.freshness import problems as stale
    from registry.trust import advance_anchor

    problems = problems_of(chain, fresh=False)
    if problems:
        raise LedgerBroken(problems)
    late = stale(chain)
    if late:
        raise StaleLedger(late)
    advance_anchor(chain.registry_id, chain.head_seq, chain.head_hash)


@contextmanager
def locked(url: str | None = None, *, known: Chain | None = None):
    """A transaction holding the ledger's write lock (head row FOR UPDATE; BEGIN IMMEDIATE on SQLite), with the
    verified chain. Yields a Chain; whatever `append` adds commits with it, or not at all.

    `known`: a chain verified just before under the act lock; when the head is still its head, its entries are
    used as they are (nothing can have been appended in between), else the whole chain is read and verified."""
    import copy

    import sqlalchemy as sa

    from registry.trust import advance_anchor

    url = ledger_url(url)
    eng = engine(url)
    with db_errors(url, "write"), eng.begin() as conn:
        chain = None
        if known is not None and known.world is not None:
            query = sa.select(HEAD.c.seq, HEAD.c.hash).where(HEAD.c.id == 1)
            if conn.dialect.name == "postgresql":
                query = query.with_for_update()
            if tuple(conn.execute(query).one()) == (known.head_seq, known.head_hash):
                chain = Chain(known.registry_id, known.root, list(known.entries), known.head_seq, known.head_hash,
                              known.world)
        if chain is None:
            chain = read_chain(conn, url, for_update=True)
            check(chain)
        chain.url = url
        chain.world = copy.deepcopy(chain.world)  # the act's own: a rolled-back append never reaches the cache
        chain.conn = conn
        yield chain
    advance_anchor(chain.registry_id, chain.head_seq, chain.head_hash)


def append(chain: Chain, signer: Signer, **values: Any) -> Entry:
    """Sign and append one entry inside a `locked()` transaction, after the rules every verifier replays accept
    it (RefusedError otherwise: nothing is written). Returns it with its hash and signature."""
    evidence = values.pop("evidence", None) or {}
    row = {k: values.get(k) for k in FIELDS if k not in ("seq", "prev_hash", "evidence")}
    row.update(seq=chain.head_seq + 1, prev_hash=chain.head_hash, ts=values.get("ts") or utc_now(),
               evidence=json.loads(json.dumps(evidence, default=str)))
    row["version"] = None if row.get("version") is None else str(row["version"])
    if signer is None or row.get("actor") != signer.name:
        raise RefusedError(f"an entry in the name of '{row.get('actor')}' can only be signed with their own key, "
                           f"not {signer!r}. Nothing was changed.")
    digest = entry_hash(row)
    entry = Entry(**{**row, "hash": digest, "signature": signer.sign(statement(chain.registry_id, digest))})
    world = chain.world if chain.world is not None else World()
    bad = signature_problem(world, entry, chain.registry_id, chain.root) or problem(world, entry)
    if bad:
        raise RefusedError(f"the registry's rules refuse this {entry.action} of '{entry.model}' by "
                           f"{entry.actor}: {bad}. Nothing was changed.")
    conn = chain.conn
    conn.execute(LEDGER.insert().values(**{**row, "evidence": json.dumps(row["evidence"], sort_keys=True)},
                                        hash=digest, signature=entry.signature))
    conn.execute(HEAD.update().where(HEAD.c.id == 1).values(seq=row["seq"], hash=digest))
    advance(world, entry)
    chain.world = world
    chain.entries.append(entry)
    chain.head_seq, chain.head_hash = entry.seq, digest
    return entry


def entries(model: str | None = None, url: str | None = None) -> list[Entry]:
    """Every entry (of one model), oldest first, as stored (unverified: `verified()` is what decisions read)."""
    import sqlalchemy as sa

    url = ledger_url(url)
    query = sa.select(LEDGER).order_by(LEDGER.c.seq)
    if model is not None:
        query = query.where(LEDGER.c.model == model)
    with db_errors(url), reader(url).connect() as conn:
        rows = conn.execute(query).mappings().all()
    return [_entry(r) for r in rows]


def _entry(row) -> Entry:
    data = dict(row)
    data["evidence"] = json.loads(data["evidence"]) if data.get("evidence") else {}
    data["signature"] = data.get("signature") or ""
    return Entry(**data)


def chain_problems(all_entries: list[Entry], head_seq: int, head_hash: str,
                   anchor: tuple[int, str] | None = None, pinned: tuple[int, str] | None = None) -> list[str]:
    """Where the chain breaks: an edited entry, a gap (deleted or inserted), a head that disagrees, or an end
    before a head this machine verified or was told to trust (entries cut off, history rewritten)."""
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
        if entry_hash(e.as_row()) != e.hash:
            problems.append(f"entry {e.seq} ({e.action} {e.model} v{e.version} by {e.actor}): its content does not "
                            "match its hash (it was edited or forged)")
        prev = e.hash
        expected_seq += 1
    last_seq = all_entries[-1].seq if all_entries else 0
    if (last_seq, prev) != (head_seq, head_hash):
        problems.append(f"the ledger ends at entry {last_seq} but its head records entry {head_seq}: entries after "
                        f"{last_seq} were deleted, or the head was edited")
    for seen, where in ((anchor, "this machine verified"), (pinned, "the deployment pins (MLOPS_TRUST_HEAD)")):
        if not seen or not seen[0]:
            continue
        seen_seq, seen_hash = seen
        if seen_seq > last_seq:
            problems.append(f"the ledger ends at entry {last_seq}, but {where} entry {seen_seq}: entries were cut "
                            "off its end (or the ledger was wiped)")
        elif {e.seq: e.hash for e in all_entries}.get(seen_seq) != seen_hash:
            problems.append(f"entry {seen_seq} is not the one {where}: history was rewritten")
    return problems
