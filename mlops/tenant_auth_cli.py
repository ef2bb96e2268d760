"""`mlops team ...`: the tracking server's per-team permissions (mlops/tenant_auth.py). Core imports no stage, so
the teams come from a file: the release policy YAML (`registry.teams`) or a bare `{team: {members: [...]}}`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from mlops.errors import ConfigError

app = typer.Typer(help="Teams on the tracking server: permissions of the basic-auth app.", no_args_is_help=True)


def read_teams(path: Path) -> dict[str, dict]:
    """`registry.teams` of a release policy file, or a file that holds only the teams."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--teams {path} could not be read ({err}). Fix: pass the release policy YAML "
                          "(configs/registry/release.yaml) or a YAML of `team: {members: [...]}`.") from None
    if isinstance(data, dict) and "registry" in data:
        data = (data.get("registry") or {}).get("teams")
    elif isinstance(data, dict) and list(data) == ["teams"]:
        data = data["teams"]
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"--teams {path} defines no teams. Fix: add `registry: teams: <team>: members: [...]` "
                          "(the release policy) or `<team>: {members: [...]}`.")
    return {team: {"members": (spec or {}).get("members")} for team, spec in data.items()}


def _owners(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, team = pair.rpartition("=")
        if not sep or not name or not team:
            raise ConfigError(f"--model {pair} is not NAME=TEAM. Fix: write e.g. --model support-bot=team-a")
        out[name] = team
    return out


@app.command("sync-auth")
def sync_auth(
    teams: Path = typer.Option(..., "--teams", help="release policy YAML (registry.teams) or {team: {members}}"),
    tracking_uri: str = typer.Option(None, "--tracking-uri", help="the basic-auth server (default: "
                                     "MLFLOW_TRACKING_URI)"),
    model: list[str] = typer.Option([], "--model", help="NAME=TEAM: owner of a registered model whose training "
                                    "runs do not say it (repeatable)"),
    create_experiments: bool = typer.Option(True, help="create each team's <team>/default experiment"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Give each team's members MANAGE on its experiments and models, revoke what members hold on other teams'
    (as the admin in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD). A second run changes nothing."""
    from mlops.tenant_auth import sync_permissions

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri.startswith(("http://", "https://")):
        raise ConfigError(f"tracking URI '{uri}' is not a tracking server. Fix: pass --tracking-uri "
                          "http://HOST:5000 of the `mlflow server --app-name basic-auth`.")
    changes = sync_permissions(uri, read_teams(teams), create_experiments=create_experiments,
                               models=_owners(model))
    if as_json:
        typer.echo(json.dumps([c._asdict() for c in changes], indent=2))
        return
    for c in changes:
        typer.echo(f"{c.action:6} {c.permission:7} {c.resource_type} {c.resource} -> {c.user}")
    typer.echo(f"{len(changes)} change(s)" if changes else "permissions already in force: nothing changed")


@app.command("auth-config")
def auth_config(
    db_uri: str = typer.Option(..., "--db-uri", help="the auth app's own database, e.g. postgresql://.../mlflow_auth"),
    admin_user: str = typer.Option("admin", "--admin-user"),
    cache_ttl_seconds: int = typer.Option(0, "--cache-ttl-seconds", min=0, help="cache a checked password this "
                                          "long per worker (each check is a slow PBKDF2 hash); 0: off"),
) -> None:
    """Print basic_auth.ini (default_permission = NO_PERMISSIONS). The admin password stays out of the file: start
    the server once with MLFLOW_AUTH_ADMIN_PASSWORD set, which creates the admin."""
    from mlops.tenant_auth import auth_config_text

    typer.echo(auth_config_text(db_uri, admin_user, "", cache_ttl_seconds=cache_ttl_seconds), nl=False)
