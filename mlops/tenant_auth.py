"""The tracking server's permissions per team: each team's members MANAGE its `<team>/...` experiments and the
registered models it owns, and nobody else gets anything (the auth app's `default_permission` is
NO_PERMISSIONS; admins bypass every check).

MLflow's basic-auth app keeps a user's grants as rows of a hidden per-user role (`__user_<id>__`). A sync reads
those rows, grants what is missing, raises what is lower and revokes a listed member's grant on a team
resource that is not theirs (someone who left the team), so a second run changes nothing. Users are created by
an admin with their own passwords; the sync never creates one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from mlops.errors import ConfigError, TrackingError
from mlops.tenancy import check_team_name, team_experiment, team_of_experiment

EXPERIMENT, MODEL, MANAGE = "experiment", "registered_model", "MANAGE"
ADMIN_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


class Grant(NamedTuple):
    user: str
    resource_type: str  # "experiment" or "registered_model"
    resource: str  # experiment or registered model name
    permission: str


class Change(NamedTuple):
    action: str  # grant, update or revoke
    user: str
    resource_type: str
    resource: str
    permission: str


def members_of(teams: Mapping[str, Any]) -> dict[str, list[str]]:
    """{team: sorted members} from `registry.teams` dicts or TeamPolicy objects."""
    out = {}
    for team, spec in teams.items():
        members = spec.get("members") if isinstance(spec, Mapping) else getattr(spec, "members", None)
        if not members or not all(isinstance(m, str) and m for m in members):
            raise ConfigError(f"registry.teams.{team}.members is {members!r}: a team needs a list of user names. "
                              f"Fix: write e.g. `members: [alice, bob]` under registry.teams.{team}.")
        out[check_team_name(team)] = sorted(set(members))
    return out


def plan_permissions(teams: Mapping[str, Any], experiments: list[str], models: Mapping[str, str]) -> list[Grant]:
    """Every grant the server must hold: MANAGE for a team's members on its experiments and models, nothing else."""
    members = members_of(teams)
    grants = set()
    for name in experiments:
        team = team_of_experiment(name)
        grants |= {Grant(user, EXPERIMENT, name, MANAGE) for user in members.get(team or "", [])}
    for model, team in models.items():
        if team not in members:
            raise ConfigError(f"registered model '{model}' is owned by team '{team}', which registry.teams does not "
                              f"define (teams: {', '.join(sorted(members)) or '(none)'}). Fix: add the team to the "
                              "policy, or pass the right owner.")
        grants |= {Grant(user, MODEL, model, MANAGE) for user in members[team]}
    return sorted(grants)


def auth_config_text(db_uri: str, admin_user: str, admin_password: str, *,
                     cache_ttl_seconds: int = 0) -> str:
    """basic_auth.ini for `mlflow server --app-name basic-auth` (MLFLOW_AUTH_CONFIG_PATH): deny by default.
    The admin password is read only while the auth database has no admin; MLFLOW_AUTH_ADMIN_PASSWORD overrides
    it, so a deployment leaves it out of the file (pass ""). Every request checks its password hash (werkzeug's
    PBKDF2, ~1 s on a busy 2-core box); `cache_ttl_seconds` > 0 caches a checked password per worker for that
    long, at the price of a changed or deleted password being honoured on other workers until it expires."""
    lines = ["[mlflow]", "default_permission = NO_PERMISSIONS", f"database_uri = {db_uri}",
             f"admin_username = {admin_user}"]
    if admin_password:
        lines.append(f"admin_password = {admin_password}")
    lines += ["authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
              "grant_default_workspace_access = false", f"auth_cache_ttl_seconds = {int(cache_ttl_seconds)}"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- against a tracking server


def _auth_error(err: Exception, what: str, uri: str, user: str | None = None) -> Exception:
    code = getattr(err, "error_code", "")
    if code == "RESOURCE_DOES_NOT_EXIST" and user:
        return ConfigError(f"team member '{user}' has no user in the tracking server's auth app ({uri}); nothing "
                           f"was granted to them. Fix: as an admin create it with its own password "
                           f"(`AuthServiceClient('{uri}').create_user('{user}', <password>)`, or the server's "
                           "UI), then rerun `mlops team sync-auth`.")
    if code in ("PERMISSION_DENIED", "UNAUTHENTICATED") or re.search(r"error code 40[13]\b", str(err)):
        return TrackingError(f"the auth app at {uri} refused {what} ({code or err}). Fix: run as an admin of the "
                             f"server: set {ADMIN_ENV[0]} and {ADMIN_ENV[1]} to an admin's name and password.")
    return TrackingError(f"{what} failed at {uri} ({type(err).__name__}: {str(err)[:300]}). Fix: check that "
                         "`mlflow server --app-name basic-auth` runs there and answers /health.")


def _call(uri: str, what: str, fn, *args):
    try:
        return fn(*args)
    except Exception as err:
        raise _auth_error(err, what, uri) from err


def _direct_grants(auth, user: str, uri: str) -> dict[tuple[str, str], Any]:
    """{(resource_type, pattern): RolePermission} of `user`'s own grants (its synthetic role's rows)."""
    try:
        own = f"__user_{auth.get_user(user).id}__"
        roles = auth.list_user_roles(user)
    except Exception as err:
        raise _auth_error(err, f"reading the grants of user {user}", uri, user) from err
    return {(p.resource_type, p.resource_pattern): p for r in roles if r.name == own for p in r.permissions}


def model_owners(client, known: set[str]) -> dict[str, str]:
    """{registered model: team} for models whose versions all come from runs of one known team (Tag.TEAM on
    the run, else its experiment's prefix). Models from nobody's or several teams' runs are left out."""
    from mlops.lineage import Tag

    experiment_team: dict[str, str | None] = {}
    owners = {}
    for rm in _pages(client.search_registered_models):
        teams = set()
        for mv in _pages(client.search_model_versions, f"name='{rm.name}'"):
            if not mv.run_id:
                teams.add(None)
                continue
            run = client.get_run(mv.run_id)
            exp = run.info.experiment_id
            if exp not in experiment_team:
                experiment_team[exp] = team_of_experiment(client.get_experiment(exp).name)
            teams.add(run.data.tags.get(Tag.TEAM) or experiment_team[exp])
        if len(teams) == 1 and (team := teams.pop()) in known:
            owners[rm.name] = team
    return owners


def sync_permissions(tracking_uri: str, teams: Mapping[str, Any], *, create_experiments: bool = True,
                     models: Mapping[str, str] | None = None) -> list[Change]:
    """Make the server's grants match the plan, as the admin in MLFLOW_TRACKING_USERNAME/PASSWORD; the changes.
    `models` (name -> team) adds to or overrides the owners found from the models' training runs."""
    from mlflow.server.auth.client import AuthServiceClient

    from mlops.tracking import client as tracking_client
    from mlops.tracking import ensure_experiment

    uri = tracking_uri
    if not all(os.environ.get(name) for name in ADMIN_ENV):
        raise ConfigError(f"{ADMIN_ENV[0]} and {ADMIN_ENV[1]} are not both set. Fix: export an admin's name and "
                          f"password of the auth app at {uri}.")
    members = members_of(teams)
    auth, mlc = AuthServiceClient(uri), tracking_client(uri)
    current = {user: _direct_grants(auth, user, uri) for user in sorted({u for m in members.values()
                                                                                  for u in m})}
    if create_experiments:
        for team in members:
            ensure_experiment(mlc, team_experiment(team, "default"), uri)
    ids = {e.name: e.experiment_id for e in _pages(mlc.search_experiments)
           if team_of_experiment(e.name) in members}
    owners = {**model_owners(mlc, set(members)), **(models or {})}
    key = {EXPERIMENT: ids.__getitem__, MODEL: str}
    wanted: dict[str, dict[tuple[str, str], Grant]] = {user: {} for user in current}
    for g in plan_permissions(teams, list(ids), owners):
        wanted[g.user][(g.resource_type, key[g.resource_type](g.resource))] = g
    managed = {(EXPERIMENT, i) for i in ids.values()} | {(MODEL, name) for name in owners}
    names = {i: n for n, i in ids.items()}
    changes = []
    for user, have in current.items():
        for (kind, rid), grant in wanted[user].items():
            row = have.get((kind, rid))
            if row is not None and row.permission == grant.permission:
                continue
            if row is None:
                _call(uri, f"a grant to {user}", auth.grant_user_permission, user, kind, rid, grant.permission)
            else:  # a lower grant: grant_user_permission answers RESOURCE_ALREADY_EXISTS, it does not upsert
                _call(uri, f"an update of {user}'s grant", auth.update_role_permission, row.id, grant.permission)
            changes.append(Change("update" if row else "grant", user, kind, grant.resource, grant.permission))
        for (kind, rid), row in have.items():
            if (kind, rid) in managed and (kind, rid) not in wanted[user]:
                _call(uri, f"a revocation of {user}'s grant", auth.revoke_user_permission, user, kind, rid)
                changes.append(Change("revoke", user, kind, names.get(rid, rid), row.permission))
    return changes


def _pages(search, *args):
    """Every item of a paged MLflow search."""
    token = None
    while True:
        page = search(*args, page_token=token) if token else search(*args)
        yield from page
        token = page.token
        if not token:
            return
