"""Layer 3 (storage): where attestations live: `mlops_attestations`, a table beside the ledger in its database.

One row per DSSE envelope (`registry.attestation`): its id (the sha256 of the envelope), kind, the digest of its
subjects, its signer as the envelope names it, when it was stored, and the envelope itself. Rows are only added.
A row is a claim, not evidence: readers open every envelope against the verified ledger's keys and the recorded
policy (`usable`), so a row written by hand, or by anyone the policy does not name, counts for nothing. An act that
stands on attestations (registration, approval, promotion) copies their envelopes into its signed ledger entry,
so every verifier re-derives its gates from the ledger alone.

`attest_from_env` is what a step calls when it has produced evidence: it signs as MLOPS_USER (unlocked with
MLOPS_PASSWORD) and stores the envelope; without an identity, or without a registry in the store, it signs
nothing and says what the step's evidence is then worth.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
_READY: set[str] = set()


def _table():
    import sqlalchemy as sa

    meta = sa.MetaData()
    table = sa.Table(
        "mlops_attestations", meta,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("subject_key", sa.String(128), nullable=False, index=True),
        sa.Column("signer", sa.String(80), nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
        sa.Column("envelope", sa.Text, nullable=False),
    )
    return meta, table


META, TABLE = _table()


def create_table(url: str | None = None) -> None:
    from registry.ledger import db_errors, engine, ledger_url

    db = ledger_url(url)
    with db_errors(db, "create"):
        META.create_all(engine(db), checkfirst=True)
    _READY.add(db)


def _ready(url: str | None) -> str:
    from registry.ledger import ledger_url

    db = ledger_url(url)
    if db not in _READY:
        create_table(db)  # a registry bootstrapped before attestations existed
    return db


def record(envelope: dict, kind: str, subject_key: str, signer: str, *, url: str | None = None) -> str:
    """Store an envelope (a rerun of the same statement is a no-op); returns its id."""
    import json

    import sqlalchemy as sa

    from registry.attestation import envelope_id
    from registry.ledger import db_errors, engine, utc_now

    db = _ready(url)
    ident = envelope_id(envelope)
    with db_errors(db, "write"), engine(db).begin() as conn:
        if conn.execute(sa.select(TABLE.c.id).where(TABLE.c.id == ident)).first() is None:
            conn.execute(TABLE.insert().values(id=ident, kind=kind, subject_key=subject_key, signer=signer,
                                               created=utc_now(), envelope=json.dumps(envelope, sort_keys=True)))
    return ident


def stored(kind: str, subject_key: str, *, url: str | None = None, limit: int = 50) -> list[dict]:
    """The envelopes of `kind` about `subject_key`, newest first, as stored (unverified)."""
    import json

    import sqlalchemy as sa

    from registry.ledger import db_errors, ledger_url, reader

    db = ledger_url(url)
    query = (sa.select(TABLE.c.envelope).where(TABLE.c.kind == kind, TABLE.c.subject_key == subject_key)
             .order_by(TABLE.c.created.desc(), TABLE.c.id).limit(limit))
    with db_errors(db), reader(db).connect() as conn:
        if db not in _READY and not sa.inspect(conn).has_table(TABLE.name):
            return []  # a registry from before attestations, nothing attested yet: never a write in a read
        rows = conn.execute(query).all()
    out = []
    for (text,) in rows:
        try:
            out.append(json.loads(text))
        except ValueError:
            continue  # a row that is no JSON is no evidence either
    return out


def usable(kind: str, subject_key: str, users: dict, attestors: dict | None, *, url: str | None = None):
    """The stored attestations of `kind` about `subject_key` that verify and whose signer the policy names,
    newest first, as (Attestation, envelope) pairs. Lazy: a reader that wants the newest opens one envelope."""
    from registry.attestation import AttestationProblem, open_envelope

    for envelope in stored(kind, subject_key, url=url):
        try:
            yield open_envelope(envelope, users, attestors, kind), envelope
        except AttestationProblem as why:
            log.debug("a stored %s attestation about %s is no evidence: %s", kind, subject_key[:12], why)


def signed_in() -> bool:
    """Whether this process runs as an identity (MLOPS_USER and MLOPS_PASSWORD): a step asks before it hashes
    anything for a statement it could not sign."""
    import os

    from mlops.identities import PASSWORD_ENV, USER_ENV

    return bool(os.environ.get(USER_ENV, "").strip() and os.environ.get(PASSWORD_ENV))


def attest_from_env(kind: str, subjects: dict[str, str], predicate: dict, *, subject_key: str,
                    materials: dict[str, str] | None = None, url: str | None = None) -> str | None:
    """Sign and store a step's statement as the identity in MLOPS_USER / MLOPS_PASSWORD; its id, or None (and a
    warning naming the fix) when no identity is given or the store holds no registry."""
    from mlops.identities import PASSWORD_ENV, USER_ENV, from_env
    from registry.attestation import attest
    from registry.resolve import present

    if not signed_in():
        log.warning("the %s evidence was not attested: no identity (%s, %s). The registry's gates count only "
                    "attested evidence. Fix: run the step signed in as an identity the release policy names for "
                    "%s evidence.", kind, USER_ENV, PASSWORD_ENV, kind)
        return None
    if not present(url):
        return None
    who = from_env()
    envelope = attest(who.signer, kind, subjects, predicate, materials)
    ident = record(envelope, kind, subject_key, who.name, url=url)
    log.info("%s evidence attested by %s (attestation %s)", kind, who.name, ident[:12])
    return ident


def attest_version(kind: str, name: str | None, version: str | None, predicate: dict, *,
                   materials: dict[str, str] | None = None, url: str | None = None) -> str | None:
    """Attest evidence about a registered version: its subjects are the files its signed registration names
    (so the statement binds exactly the bytes the ledger released). None for a model that is no registered
    version (nothing to gate), or when `attest_from_env` signs nothing."""
    from registry.resolve import present, verified_state

    if not name or not version or not present(url):
        return None
    vs = verified_state(name, url=url).versions.get(str(version))
    if vs is None:
        log.warning("%s evidence about %s/%s not attested: that version is not in the ledger", kind, name, version)
        return None
    return attest_from_env(kind, vs.evidence.get("files") or {}, predicate, subject_key=vs.evidence["files_digest"],
                           materials=materials, url=url)
