"""Where a team's things live: one rule for names and prefixes, read by the data build, the training service,
the usage report and the tracking server's permissions.

A team's snapshots live under `<snapshots root>/teams/<team>/`, its checkpoints and Ray Train storage under
`<checkpoints root>/teams/<team>/`, and its runs in MLflow experiments named `<team>/<experiment>`. Snapshots
and model versions outside any team prefix (built before teams existed) belong to nobody and stay readable by
everyone; whatever lives under another team's prefix needs that team's grant (`registry.teams.<t>.granted`).
"""

from __future__ import annotations

import re
from pathlib import Path

from mlops.errors import ConfigError

TEAM_RE = re.compile(r"^[a-z][a-z0-9-]{1,39}$")
TEAMS = "teams"


def check_team_name(name: str) -> str:
    if not TEAM_RE.match(name or ""):
        raise ConfigError(f"team name '{name}' is not valid: use 2-40 lowercase letters, digits or '-', starting "
                          "with a letter (it becomes a folder and an experiment prefix). Fix: rename the team in "
                          "registry.teams, e.g. search-ranking.")
    return name


def team_snapshots_dir(team: str, root: Path | None = None) -> Path:
    from mlops.paths import snapshots_dir

    return (root or snapshots_dir()) / TEAMS / check_team_name(team)


def team_checkpoints_dir(team: str, root: Path | None = None) -> Path:
    from mlops.paths import checkpoints_dir

    return (root or checkpoints_dir()) / TEAMS / check_team_name(team)


def team_experiment(team: str, experiment: str) -> str:
    """The MLflow experiment a team's runs of `experiment` go to (permissions are granted per experiment)."""
    prefix = f"{check_team_name(team)}/"
    return experiment if experiment.startswith(prefix) else prefix + experiment


def team_of_experiment(name: str) -> str | None:
    head, sep, _ = name.partition("/")
    return head if sep and TEAM_RE.match(head) else None


def owner_of_path(folder: Path, root: Path) -> str | None:
    """The team whose prefix under `root` holds `folder`; None outside every team prefix."""
    try:
        parts = folder.resolve().relative_to(root.resolve()).parts
    except ValueError:
        return None
    return parts[1] if len(parts) >= 3 and parts[0] == TEAMS else None
