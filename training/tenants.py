"""Fences between teams, checked when a job is submitted: which snapshot root a team's job reads, whether it may
start from a model version, and where its checkpoints go. A team reads its own prefix and the shared root (data
from before teams existed); another team's snapshot or model version needs a grant in the signed policy
(`registry.teams.<team>.granted`, changed only by an admin's ledgered `policy set`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from mlops.errors import ConfigError, NotFoundError
from mlops.identities import AuthError
from mlops.paths import SNAPSHOTS_ENV
from mlops.tenancy import team_checkpoints_dir, team_snapshots_dir


@contextlib.contextmanager
def snapshot_root(root: Path):
    """Resolve snapshots under `root` for the duration (the planner and config checks read the default root)."""
    old = os.environ.get(SNAPSHOTS_ENV)
    os.environ[SNAPSHOTS_ENV] = str(root)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(SNAPSHOTS_ENV, None)
        else:
            os.environ[SNAPSHOTS_ENV] = old


def scope_snapshot(name: str | None, team: str, teams: dict) -> tuple[str, Path]:
    """(snapshot id, the root it lives under) for a job of `team`; AuthError for another team's ungranted one."""
    from mlops.data.snapshot import list_snapshots, resolve_snapshot
    from mlops.paths import snapshots_dir

    if not name:
        raise ConfigError("train.snapshot is not set. Fix: pass train.snapshot=<id> (a snapshot of your team, "
                          f"under {team_snapshots_dir(team)}) or train.snapshot=latest.")
    own, shared = team_snapshots_dir(team), snapshots_dir()
    if name == "latest":
        for root in (own, shared):
            found = list_snapshots(root)
            if found:
                return found[0]["snapshot_id"], root
        raise NotFoundError(f"train.snapshot=latest but team {team} has no complete snapshot under {own} (nor "
                            f"under the shared root {shared}). Fix: build one with `mlops data build --config "
                            f"<yaml> data.output_dir={own}`.")
    for root in (own, shared):
        with contextlib.suppress(NotFoundError):
            return resolve_snapshot(name, root).name, root
    for other in sorted(set(teams) - {team}):
        root = team_snapshots_dir(other)
        with contextlib.suppress(NotFoundError):
            sid = resolve_snapshot(name, root).name
            if f"snapshot:{sid}" in teams[team].granted:
                return sid, root
            raise AuthError(f"snapshot {sid} belongs to team {other}, and team {team} has no grant for it. Nothing "
                            f"was queued. Fix: train on a snapshot of team {team}, or ask an admin to add "
                            f"`snapshot:{sid}` to registry.teams.{team}.granted (`mlops registry policy set`).")
    resolve_snapshot(name, own)  # raises NotFoundError naming the team's snapshots
    raise AssertionError("unreachable")


def check_base_model(base_model: str, team: str, teams: dict) -> None:
    """A job may start from a registered version only if its training run was its own team's, nobody's, or
    granted (`model:<name>/<version>`)."""
    if not base_model.startswith("models:/"):
        return
    from mlops.lineage import Tag
    from mlops.run_store import get_run
    from mlops.tracking import client

    name, _, version = base_model.removeprefix("models:/").partition("/")
    if not version.isdigit():
        raise ConfigError(f"base_model={base_model}: a team job starts from a numbered version, not an alias "
                          f"(an alias may move after the check). Fix: pass models:/{name}/<version>.")
    mv = client().get_model_version(name, version)
    owner = get_run(mv.run_id).data.tags.get(Tag.TEAM) if mv.run_id else None
    if owner in (None, team) or f"model:{name}/{version}" in teams[team].granted:
        return
    raise AuthError(f"model version {name}/{version} was trained by team {owner}, and team {team} has no grant "
                    f"for it. Nothing was queued. Fix: start from a version of team {team}, or ask an admin to add "
                    f"`model:{name}/{version}` to registry.teams.{team}.granted (`mlops registry policy set`).")


def team_ckpt_root(team: str, storage_path: str | None) -> Path:
    return team_checkpoints_dir(team, Path(storage_path).expanduser().resolve() if storage_path else None)


def check_ckpt_dir(configured: str | None, team: str, root: Path) -> None:
    """An explicit train.checkpoint.dir must lie under the team's own prefix."""
    if not configured:
        return
    folder = Path(configured).expanduser().resolve()
    if root.resolve() not in (folder, *folder.parents):
        raise AuthError(f"train.checkpoint.dir={configured} is outside team {team}'s prefix {root}. Nothing was "
                        f"queued. Fix: leave it unset (the job uses {root}/<config hash>) or pick a folder under "
                        f"{root}.")
