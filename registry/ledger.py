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
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from mlops.errors import MLOpsError
from registry.db import (  # noqa: F401 - where the ledger's callers have always found them
    BOOTSTRAP_FIX,
    DB_ENV,
    LedgerBroken,
    LedgerError,
    NoRegistry,
    _db_error,
    _missing_table,
    db_errors,
    display,
    engine,
    ledger_url,
    lock_engine,
    reader,
    utc_now,
)
from registry.entries import FIELDS, GENESIS, Entry, canonical, entry_hash  # noqa: F401 - the ledger's vocabulary
from registry.rules import RefusedError, World, advance, problem, signature_problem
from registry.signing import Signer, statement


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
