"""Layer 3 (storage): freshness, a signed timestamp over the ledger's head (as TUF's timestamp role), in a table of
its own beside the ledger (`mlops_timestamp`).

The attack it stops: a database writer serves a replica that pins only the root (no `MLOPS_TRUST_HEAD`, no anchor
yet) the ledger cut back to an older head, every entry of it validly signed: the replica would serve a release
that was rolled back, or never see a revocation (a freeze). With `registry.freshness.hours` set in the recorded
policy (the issue's `registry.freshness_hours`), every verified read and every act also needs the newest row of
`mlops_timestamp` to be a statement {registry id, head seq, head hash, issued, expires, signer} that:
- is signed by the Ed25519 key the verified ledger holds for its signer, an identity of a role in
  `registry.freshness.signer_roles` (admin by default), for this registry;
- has not expired (at `expires`, or `hours` after `issued` if sooner: a shorter policy shortens old timestamps);
- vouches for a head this ledger holds (the entry at that seq has that hash; the ledger may have grown since);
- is not older than the newest timestamp this machine verified (`<registry id>.timestamp`, mode 600, beside the
  anchor; in memory where the key folder is read-only), so an older statement written back is refused too.
So a frozen copy is refused once its newest timestamp expires: a replica trusts no ledger older than `hours`.

`mlops registry timestamp` (from cron, several times within `hours`) verifies the ledger, then signs and stores
a statement over its head. It is not a ledger entry and never moves the head; it is the one reader that does not
itself need a fresh timestamp (else an expired one could never be renewed), so run it where the anchor persists.
Writers enforce freshness too: an act verifies the ledger first, and a writer given a frozen copy would build
on it. So when the timestamp expires (cron stopped, the signer's key rotated or revoked: the signature is checked
against the key the ledger holds now) every read and act is refused, naming the command, until it is re-signed;
serving stays on the last verified version meanwhile. Unset (the default), nothing here is read. Sign once
before recording a policy that sets `hours` (a timestamp signed under no `hours` is valid for DEFAULT_HOURS), so
reads never see a gap. Rows: the newest KEEP are kept.
"""

from __future__ import annotations

import contextvars
import json
import re
import time
from contextlib import contextmanager

from mlops.errors import MLOpsError
from registry.db import LedgerBroken

TABLE_NAME = "mlops_timestamp"
FORMAT = "mlops-timestamp/1"
KEEP = 500  # rows kept (hourly cron: three weeks)
DEFAULT_HOURS = 24.0  # validity of a timestamp signed while the policy sets no `hours`
SKEW_S = 300.0  # a timestamp issued further in the future than this is refused (a signer's clock is off)
ISO_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
COMMAND = "mlops registry timestamp"
_EXEMPT = contextvars.ContextVar("mlops_freshness_exempt", default=False)
_TABLE = None


class StaleLedger(LedgerBroken):
    """The chain verifies, but no valid, unexpired timestamp vouches for it: it may be a frozen copy."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        MLOpsError.__init__(self, f"the release ledger is not vouched fresh: {problems[0]} Nothing was changed and "
                                  "no release decision is taken from it; serving stays on the last verified version.")


def _now() -> float:
    return time.time()


def iso(seconds: float) -> str:
    micros = round(seconds * 1e6)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(micros // 10**6)) + f".{micros % 10**6:06d}Z"


def _seconds(text: str) -> float:
    from datetime import UTC, datetime

    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def table():
    global _TABLE
    if _TABLE is None:
        import sqlalchemy as sa

        _TABLE = sa.Table(
            TABLE_NAME, sa.MetaData(),
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("registry_id", sa.String(64), nullable=False),
            sa.Column("head_seq", sa.Integer, nullable=False),
            sa.Column("head_hash", sa.String(64), nullable=False),
            sa.Column("issued", sa.String(40), nullable=False),
            sa.Column("expires", sa.String(40), nullable=False),
            sa.Column("signer", sa.String(80), nullable=False),
            sa.Column("signature", sa.String(128), nullable=False),
        )
    return _TABLE


def create_table(url: str | None = None) -> None:
    """The timestamp table (bootstrap; for a store bootstrapped before it, the first `mlops registry timestamp`)."""
    from registry.db import db_errors, engine, ledger_url

    url = ledger_url(url)
    with db_errors(url, "bootstrap"):
        table().metadata.create_all(engine(url), checkfirst=True)


def statement(body: dict) -> bytes:
    """What a timestamp's signature covers: its fields, canonical, under a format tag no ledger entry uses."""
    fields = {k: body[k] for k in ("registry_id", "head_seq", "head_hash", "issued", "expires", "signer")}
    return f"{FORMAT} {json.dumps(fields, sort_keys=True, separators=(',', ':'))}".encode()


@contextmanager
def signing():
    """Verify without needing a fresh timestamp: only for `mlops registry timestamp` (its sign-in and its read)."""
    token = _EXEMPT.set(True)
    try:
        yield
    finally:
        _EXEMPT.reset(token)


def _recorded(chain) -> dict | None:
    from registry.config import recorded_policy

    return chain.world.policy if chain.world is not None else recorded_policy(chain.entries)


def problems(chain) -> list[str]:
    """Why the verified `chain` is not vouched fresh (empty: it is, or the policy does not ask). On success the
    timestamp is remembered as the newest this machine saw."""
    from registry.config import policy_of
    from registry.trust import remember_timestamp

    recorded = _recorded(chain)
    if ((recorded or {}).get("freshness") or {}).get("hours") is None or _EXEMPT.get():
        return []
    policy = policy_of(recorded).freshness
    fix = (f"Fix: run `{COMMAND}` as an identity of role {' or '.join(policy.signer_roles)} (from cron, well "
           f"within every {policy.hours:g} hours; registry.freshness.hours).")
    row = newest(getattr(chain, "url", None))
    if row is None:
        return [f"the store holds no signed timestamp, and the recorded policy requires one no older than "
                f"{policy.hours:g} hours. {fix}"]
    bad = _problem(chain, row, policy)
    if bad:
        return [f"{bad}. {fix}"]
    remember_timestamp(chain.registry_id, row["issued"], row["head_seq"], row["head_hash"])
    return []


def _problem(chain, row: dict, policy) -> str | None:
    from registry.entries import GENESIS
    from registry.rules import users_in
    from registry.signing import verify
    from registry.trust import seen_timestamp

    shape = _shape_problem(row)
    if shape:
        return f"the newest timestamp (row {row.get('id')}) {shape}: it was not written by `{COMMAND}`"
    what = f"the newest timestamp (by {row['signer']}, issued {row['issued']}, over entry {row['head_seq']})"
    if row["registry_id"] != chain.registry_id:
        return f"{what} is for registry {row['registry_id'][:40]}, not this one ({chain.registry_id})"
    users = chain.world.users if chain.world is not None else users_in(chain.entries)
    user = users.get(row["signer"])
    if user is None:
        return f"{what} is signed in the name of no identity the ledger holds"
    if user.role not in policy.signer_roles:
        return (f"{what} is signed by an identity of role {user.role}; registry.freshness.signer_roles allows "
                f"{', '.join(policy.signer_roles)}")
    if not verify(user.public_key, statement(row), row["signature"]):
        return (f"{what} does not carry {row['signer']}'s signature under the key the ledger holds (forged, or "
                "signed with a key since rotated or revoked)")
    seq = row["head_seq"]
    held = {e.seq: e.hash for e in chain.entries}.get(seq) if seq else GENESIS
    if seq > chain.head_seq or held != row["head_hash"]:
        return (f"{what} vouches for a head this ledger does not hold (it ends at entry {chain.head_seq}): the "
                "ledger was cut back or rewritten")
    now = _now()
    issued = _seconds(row["issued"])
    if issued > now + SKEW_S:
        return f"{what} is issued in the future (the signer's clock is ahead of this machine's)"
    expires = min(_seconds(row["expires"]), issued + policy.hours * 3600)
    if now >= expires:
        return (f"{what} expired at {iso(expires)}: nobody has vouched for this ledger since, so it may be a "
                "frozen older copy")
    seen = seen_timestamp(chain.registry_id)
    if seen is not None and (row["issued"] < seen[0] or seq < seen[1]):
        return (f"{what} is older than the timestamp this machine verified before (issued {seen[0]}, over entry "
                f"{seen[1]}): an older copy was written back")
    return None


def _shape_problem(row: dict) -> str | None:
    if not isinstance(row.get("head_seq"), int) or row["head_seq"] < 0:
        return "names no entry"
    if not isinstance(row.get("head_hash"), str) or not HEX64_RE.match(row["head_hash"]):
        return "holds no hash in head_hash"
    for name in ("issued", "expires"):
        if not isinstance(row.get(name), str) or not ISO_RE.match(row[name]):
            return f"holds no UTC time in {name}"
    if not all(isinstance(row.get(k), str) for k in ("registry_id", "signer", "signature")):
        return "lacks a field"
    return None


def newest(url: str | None = None) -> dict | None:
    """The newest stored timestamp row (None: none, or no table yet)."""
    import sqlalchemy as sa

    from registry.db import _db_error, _missing_table, ledger_url, reader

    url = ledger_url(url)
    t = table()
    try:
        with reader(url).connect() as conn:
            row = conn.execute(sa.select(t).order_by(t.c.id.desc()).limit(1)).mappings().first()
    except sa.exc.SQLAlchemyError as err:
        if _missing_table(err):
            return None
        raise _db_error(err, url, "read") from None
    return dict(row) if row is not None else None
