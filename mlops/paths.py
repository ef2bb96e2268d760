"""Where the project keeps its local state. Nothing here creates folders: callers do, when they write."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "MLOPS_HOME"


def project_home() -> Path:
    """MLOPS_HOME, else the nearest folder up from here that holds `.mlops/` or `mlproject/MLproject`.

    `mlflow run mlproject` starts entry points inside `mlproject/`, so walking up finds the same home the
    user's shell uses.
    """
    explicit = os.environ.get(HOME_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser().resolve()
    cwd = Path.cwd().resolve()
    for folder in (cwd, *cwd.parents):
        if (folder / ".mlops").is_dir() or (folder / "mlproject" / "MLproject").is_file():
            return folder
    return cwd


def mlops_dir() -> Path:
    return project_home() / ".mlops"


def models_dir() -> Path:
    return mlops_dir() / "models"


def snapshots_dir() -> Path:
    return mlops_dir() / "snapshots"


def runs_dir() -> Path:
    return mlops_dir() / "runs"
