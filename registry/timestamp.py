"""Layer 4 (acts): `mlops registry timestamp`: sign the freshness statement over the verified head (from cron).

What a timestamp is, and how every read judges it, is `registry.freshness`; this is the act that makes one.
"""

from __future__ import annotations

from registry import freshness  # its clock is read at each call (tests move it)
from registry.freshness import (
    COMMAND,
    DEFAULT_HOURS,
    KEEP,
    _recorded,
    create_table,
    iso,
    signing,
    statement,
    table,
)


def stamp(actor, url: str | None = None) -> dict:
    """Verify the ledger, then sign and store a timestamp over its head as `actor` (a role the policy names).
    Not a ledger entry: the head does not move. Returns the statement stored."""
    from mlops.identities import AuthError
    from registry.config import policy_of
    from registry.db import db_errors, engine, ledger_url
    from registry.ledger import verified
    from registry.rules import users_in
    from registry.trust import remember_timestamp

    db = ledger_url(url)
    with signing():
        chain = verified(db)
    policy = policy_of(_recorded(chain)).freshness
    roles = " or ".join(policy.signer_roles)
    user = users_in(chain.entries).get(getattr(actor, "name", None))
    signer = getattr(actor, "signer", None)
    if user is None or signer is None or signer.public_key != user.public_key:
        raise AuthError(f"'{getattr(actor, 'name', actor)}' signs no timestamp without their own key, as the ledger "
                        "holds it. Nothing was signed. Fix: sign in with MLOPS_USER and MLOPS_PASSWORD.")
    if user.role not in policy.signer_roles:
        raise AuthError(f"'{user.name}' has role '{user.role}'; registry.freshness.signer_roles lets only {roles} "
                        f"sign timestamps. Nothing was signed. Fix: run `{COMMAND}` as an identity of role {roles}.")
    now = freshness._now()
    hours = policy.hours if policy.hours is not None else DEFAULT_HOURS
    body = {"registry_id": chain.registry_id, "head_seq": chain.head_seq, "head_hash": chain.head_hash,
            "issued": iso(now), "expires": iso(now + hours * 3600), "signer": user.name}
    body["signature"] = signer.sign(statement(body))
    create_table(db)
    t = table()
    with db_errors(db, "write"), engine(db).begin() as conn:
        new_id = conn.execute(t.insert().values(**body)).inserted_primary_key[0]
        conn.execute(t.delete().where(t.c.id <= new_id - KEEP))
    remember_timestamp(chain.registry_id, body["issued"], body["head_seq"], body["head_hash"])
    return {**body, "enforced": policy.hours is not None, "hours": hours}
