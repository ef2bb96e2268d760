"""Layer 3 (storage): where spot-checks live: tables of their own in the registry's (the ledger's) database.

`mlops_spotcheck` (one row per check: challenger, champion, seed, the ledger entry that created it),
`mlops_spotcheck_item` (the sampled prompt, both answers in blind order, and which of A/B is the challenger:
the mapping never leaves the database), `mlops_spotcheck_verdict` (every verdict ever given, newest per item
counts). Rows are only ever added, except the check's `create_seq`, set once its ledger entry is written.
"""

from __future__ import annotations

import json
from typing import Any

_READY: set[str] = set()


def _tables():
    import sqlalchemy as sa

    meta = sa.MetaData()
    checks = sa.Table(
        "mlops_spotcheck", meta,
        sa.Column("check_id", sa.String(40), primary_key=True),
        sa.Column("model", sa.String(256), nullable=False, index=True),
        sa.Column("version", sa.String(40), nullable=False),
        sa.Column("challenger_content_id", sa.String(80)),
        sa.Column("challenger_profile_hash", sa.String(40)),
        sa.Column("champion_version", sa.String(40)),
        sa.Column("champion_content_id", sa.String(80)),
        sa.Column("champion_profile_hash", sa.String(40)),
        # Without a champion: the untuned base model the version was trained from answers the other side.
        sa.Column("baseline", sa.String(300)),
        sa.Column("created_by", sa.String(80), nullable=False),
        sa.Column("created_ts", sa.String(40), nullable=False),
        sa.Column("seed", sa.BigInteger, nullable=False),
        sa.Column("items", sa.Integer, nullable=False),
        sa.Column("strata", sa.Text, nullable=False),
        sa.Column("create_seq", sa.Integer),
    )
    items = sa.Table(
        "mlops_spotcheck_item", meta,
        sa.Column("check_id", sa.String(40), primary_key=True),
        sa.Column("item_no", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("source", sa.String(300), nullable=False),
        sa.Column("stratum", sa.String(120), nullable=False),
        sa.Column("messages", sa.Text, nullable=False),
        sa.Column("reference", sa.Text),
        sa.Column("answer_a", sa.Text, nullable=False),
        sa.Column("answer_b", sa.Text),
        sa.Column("a_is", sa.String(16), nullable=False),  # "challenger" or "champion"
        sa.Column("answers_meta", sa.Text, nullable=False),  # latency, tokens, errors per side (not shown)
    )
    verdicts = sa.Table(
        "mlops_spotcheck_verdict", meta,
        sa.Column("verdict_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("check_id", sa.String(40), nullable=False, index=True),
        sa.Column("item_no", sa.Integer, nullable=False),
        sa.Column("reviewer", sa.String(80), nullable=False),
        sa.Column("ts", sa.String(40), nullable=False),
        sa.Column("preferred", sa.String(16), nullable=False),
        sa.Column("wrong_fact", sa.String(8), nullable=False),  # "", "A", "B" or "AB"
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),  # un-blinded: better, same, worse, wrong_fact
    )
    return meta, checks, items, verdicts


META, CHECKS, ITEMS, VERDICTS = _tables()


def reader(url: str | None = None):
    """Reads go through the ledger's reader: inside an act (which holds SQLite's write lock) a read must not
    queue for that lock."""
    from registry import ledger

    engine(url)  # the tables exist
    return ledger.reader(url)


def create_tables(url: str | None = None) -> None:
    """The spot-check tables (bootstrap creates them with the registry; older registries get them on first use)."""
    from registry import ledger

    eng = ledger.engine(url)
    META.create_all(eng, checkfirst=True)
    _add_missing_columns(eng)


def engine(url: str | None = None):
    """The ledger's engine, the spot-check tables checked once per process (looked at through the reader, so an
    act that holds SQLite's write lock never waits on it; created only when missing)."""
    import sqlalchemy as sa

    from registry import ledger

    eng = ledger.engine(url)
    key = str(eng.url)
    if key not in _READY:
        inspector = sa.inspect(ledger.reader(url))
        ready = all(inspector.has_table(t.name) for t in (CHECKS, ITEMS, VERDICTS))
        if not ready or not _columns_complete(inspector):
            create_tables(url)
        _READY.add(key)
    return eng


def _columns_complete(inspector) -> bool:
    have = {c["name"] for c in inspector.get_columns(CHECKS.name)}
    return {c.name for c in CHECKS.columns} <= have


def _add_missing_columns(eng) -> None:
    """Columns added since a database's tables were made (create_all adds tables, never columns)."""
    import sqlalchemy as sa

    have = {c["name"] for c in sa.inspect(eng).get_columns(CHECKS.name)}
    with eng.begin() as conn:
        for column in CHECKS.columns:
            if column.name not in have and column.nullable:
                conn.execute(sa.text(f"ALTER TABLE {CHECKS.name} ADD COLUMN {column.name} "
                                     f"{column.type.compile(eng.dialect)}"))


def insert_check(check: dict, items: list[dict], url: str | None = None) -> None:
    row = {**check, "strata": json.dumps(check["strata"], sort_keys=True)}
    rows = [{**i, "messages": json.dumps(i["messages"], ensure_ascii=False),
             "answers_meta": json.dumps(i["answers_meta"], sort_keys=True)} for i in items]
    with engine(url).begin() as conn:
        conn.execute(CHECKS.insert().values(**row))
        conn.execute(ITEMS.insert(), rows)


def set_create_seq(check_id: str, seq: int, url: str | None = None) -> None:
    with engine(url).begin() as conn:
        conn.execute(CHECKS.update().where(CHECKS.c.check_id == check_id).values(create_seq=seq))


def insert_verdict(row: dict, url: str | None = None) -> None:
    with engine(url).begin() as conn:
        conn.execute(VERDICTS.insert().values(**row))


def get_check(check_id: str, url: str | None = None) -> dict | None:
    import sqlalchemy as sa

    with reader(url).connect() as conn:
        row = conn.execute(sa.select(CHECKS).where(CHECKS.c.check_id == check_id)).mappings().first()
    return _check(row) if row else None


def checks_of(model: str, version: str | None = None, url: str | None = None) -> list[dict]:
    """Ledgered checks of a model (or one version), newest first."""
    import sqlalchemy as sa

    query = sa.select(CHECKS).where(CHECKS.c.model == model, CHECKS.c.create_seq.is_not(None))
    if version is not None:
        query = query.where(CHECKS.c.version == str(version))
    with reader(url).connect() as conn:
        rows = conn.execute(query.order_by(CHECKS.c.create_seq.desc())).mappings().all()
    return [_check(r) for r in rows]


def items_of(check_id: str, url: str | None = None) -> list[dict]:
    import sqlalchemy as sa

    with reader(url).connect() as conn:
        rows = conn.execute(sa.select(ITEMS).where(ITEMS.c.check_id == check_id)
                            .order_by(ITEMS.c.item_no)).mappings().all()
    return [{**dict(r), "messages": json.loads(r["messages"]), "answers_meta": json.loads(r["answers_meta"])}
            for r in rows]


def current_verdicts(check_id: str, url: str | None = None) -> dict[int, dict]:
    """The newest verdict per item."""
    import sqlalchemy as sa

    with reader(url).connect() as conn:
        rows = conn.execute(sa.select(VERDICTS).where(VERDICTS.c.check_id == check_id)
                            .order_by(VERDICTS.c.verdict_id)).mappings().all()
    latest: dict[int, dict] = {}
    for r in rows:
        latest[r["item_no"]] = dict(r)
    return latest


def _check(row: Any) -> dict:
    data = dict(row)
    data["strata"] = json.loads(data["strata"])
    return data
