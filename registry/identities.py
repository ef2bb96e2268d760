"""Layer 4 (acts): identities, their keys and the release policy, as signed acts in the governance stream.

An identity is a name, a role and an Ed25519 public key, as the newest verified `bootstrap` / `user_add` /
`user_update` entry says (`registry.rules` replays them). Its private key lives in the person's own key file,
sealed under their passphrase (`registry.signing`); signing in means unlocking that file and finding its public key
in the ledger, so a name alone never acts and a revoked or rotated key acts no more.

- `bootstrap` makes the first admin's key and pins its fingerprint on this machine: the trust root that every
  consumer configures (`MLOPS_TRUST_ROOT`).
- `add_user` records a public key: one the person made themselves (`mlops registry key new`, the private half
  never leaves their machine), or a new key the admin seals under a first passphrase and hands over.
- `set_password` (`user passwd`) issues a new key: a person rotates their own, an admin re-keys anyone (a lost
  passphrase, a suspected leak). `remove_user` revokes.
"""

from __future__ import annotations

from pathlib import Path

from mlops.identities import AuthError, Identity, check_name, check_password, check_role, require
from registry.entries import GOVERNANCE  # noqa: F401 - where the governance stream's name is spelled
from registry.rules import RefusedError, User, users_in  # noqa: F401 - User: what user_of returns


def list_users(url: str | None = None) -> list[Identity]:
    from registry.ledger import verified

    return [Identity(u.name, u.role) for _, u in sorted(users_in(verified(url).entries).items())]


def user_of(name: str, url: str | None = None) -> User | None:
    from registry.ledger import verified

    return users_in(verified(url).entries).get(name)


def authenticate(name: str | None, password: str | None, url: str | None = None) -> Identity:
    """The identity whose key file `password` unlocks, with its signer; AuthError (one message for an unknown
    user, a wrong passphrase, and a key the ledger no longer names)."""
    from mlops.identities import PASSWORD_ENV, USER_ENV
    from registry.ledger import verified
    from registry.signing import KeyFileError, unlock, user_key_path

    if not name:
        raise AuthError(f"no identity given. Fix: set {USER_ENV} and {PASSWORD_ENV} (the passphrase of your key "
                        "file; users are listed by `mlops registry user list`).")
    chain = verified(url)
    user = users_in(chain.entries).get(name)
    refused = AuthError(f"authentication failed for '{name}': unknown user or wrong password (the passphrase of "
                        f"your key file; or a key the registry no longer names). Fix: check {USER_ENV} and "
                        f"{PASSWORD_ENV} (and MLOPS_KEY_FILE), or ask an admin for a new key with `mlops registry "
                        f"user passwd {name}`.")
    if user is None or not password:
        raise refused
    try:
        signer = unlock(user_key_path(chain.registry_id, name), password)
    except KeyFileError:
        raise refused from None
    if signer.name != name or signer.public_key != user.public_key:
        raise refused
    return Identity(name, user.role, signer=signer)


def issue_key(registry_id: str, name: str, passphrase: str, *, public_key: str | None = None) -> str:
    """The public key to record for `name`: the one given (the person keeps the private half), else a new key
    sealed under `passphrase` into their key file on this machine."""
    from registry.signing import new_signer, user_key_path, write_key_file

    if public_key:
        if len(public_key) != 64 or any(c not in "0123456789abcdef" for c in public_key):
            raise RefusedError(f"--public-key '{public_key[:80]}' is not an Ed25519 public key (64 hex characters). "
                               "Fix: pass what `mlops registry key new` printed.")
        return public_key
    check_password(passphrase, name=name)
    signer = new_signer(name)
    write_key_file(user_key_path(registry_id, name), signer, registry_id, passphrase)
    return signer.public_key


# --------------------------------------------------------------------------- signed acts


def bootstrap(admin: str, password: str, *, policy: dict, url: str | None = None) -> list:
    """Create the registry in an empty store: tables, the first admin's key (the pinned trust root on this
    machine), the admin and the release policy in force."""
    from registry.attest_store import create_table
    from registry.freshness import create_table as create_timestamp_table
    from registry.ledger import create_registry, ledger_url
    from registry.signing import fingerprint, unlock, user_key_path
    from registry.spotcheck_store import create_tables
    from registry.transition import Plan, run
    from registry.trust import pin_root

    check_name(admin)
    check_password(password, name=admin)
    db = ledger_url(url)
    registry_id = create_registry(db)
    create_tables(db)
    create_table(db)
    create_timestamp_table(db)
    public = issue_key(registry_id, admin, password)
    pin_root(registry_id, fingerprint(public))
    actor = Identity(admin, "admin", signer=unlock(user_key_path(registry_id, admin), password))

    def plan_for(state):
        return Plan(entries=[
            dict(actor=admin, action="bootstrap", model=GOVERNANCE, reason="the registry's first admin",
                 evidence={"name": admin, "role": "admin", "public_key": public}),
            dict(actor=admin, action="policy", model=GOVERNANCE, reason="the release policy at bootstrap",
                 evidence={"policy": policy}),
        ])

    return run(GOVERNANCE, plan_for, url=db, actor=actor)


def add_user(actor: Identity, name: str, role: str, password: str | None, *, public_key: str | None = None,
             url: str | None = None):
    from registry.ledger import verified
    from registry.transition import Plan, run

    require(actor, "manage_users")
    check_name(name)
    check_role(role)
    chain = verified(url)
    if name in users_in(chain.entries):
        raise RefusedError(f"user '{name}' already exists. Fix: use `mlops registry user passwd {name}`.")
    public = issue_key(chain.registry_id, name, password or "", public_key=public_key)

    def plan_for(state):
        if name in state.users:
            raise RefusedError(f"user '{name}' already exists. Fix: use `mlops registry user passwd {name}`.")
        return Plan(entries=[dict(actor=actor.name, action="user_add", model=GOVERNANCE, reason=f"added {name}",
                                  evidence={"name": name, "role": role, "public_key": public})])

    return run(GOVERNANCE, plan_for, url=url, actor=actor)[0]


def set_password(actor: Identity, name: str, password: str | None, *, role: str | None = None,
                 public_key: str | None = None, url: str | None = None):
    """Issue `name` a new key (one's own rotation, or anyone's as an admin) and, as an admin, a role; signed."""
    from mlops.errors import NotFoundError, did_you_mean
    from registry.ledger import verified
    from registry.transition import Plan, run

    if actor.name != name or role is not None:
        require(actor, "manage_users")
    if role is not None:
        check_role(role)
    chain = verified(url)
    user = users_in(chain.entries).get(name)
    if user is None:
        raise NotFoundError(f"user '{name}' does not exist: {did_you_mean(name, users_in(chain.entries))}. "
                            f"Fix: add it with `mlops registry user add {name} --role ...`.")
    new_role = role or user.role
    public = issue_key(chain.registry_id, name, password or "", public_key=public_key)
    what = "new key" + (f", role {user.role} -> {new_role}" if new_role != user.role else "")

    def plan_for(state):
        return Plan(entries=[dict(actor=actor.name, action="user_update", model=GOVERNANCE, reason=f"{name}: {what}",
                                  evidence={"name": name, "role": new_role, "public_key": public})])

    run(GOVERNANCE, plan_for, url=url, actor=actor)
    return Identity(name, new_role)


def remove_user(actor: Identity, name: str, *, url: str | None = None):
    """Revoke an identity and its key (admin); signed. Sessions and API sign-ins of that name end at their next
    check."""
    from mlops.errors import NotFoundError, did_you_mean
    from registry.transition import Plan, run

    require(actor, "manage_users")

    def plan_for(state):
        if name not in state.users:
            raise NotFoundError(f"user '{name}' does not exist: {did_you_mean(name, state.users)}.")
        if name == actor.name:
            raise RefusedError("an admin may not remove themselves. Fix: ask another admin.")
        return Plan(entries=[dict(actor=actor.name, action="user_remove", model=GOVERNANCE, reason=f"removed {name}",
                                  evidence={"name": name})])

    return run(GOVERNANCE, plan_for, url=url, actor=actor)[0]


def set_policy(actor: Identity, path: Path, *, url: str | None = None):
    """Record a policy file as the policy in force (admin); signed, with the values it holds."""
    from registry.config import policy_of, read_policy_file
    from registry.transition import Plan, run

    require(actor, "manage_policy")
    policy = read_policy_file(Path(path)).model_dump(mode="json")

    def plan_for(state):
        if policy_of(state.policy).model_dump(mode="json") == policy:
            raise RefusedError("that policy is already the one in force; nothing was changed.")
        return Plan(entries=[dict(actor=actor.name, action="policy", model=GOVERNANCE,
                                  reason=f"policy from {Path(path).name}", evidence={"policy": policy})])

    return run(GOVERNANCE, plan_for, url=url, actor=actor)[0]
