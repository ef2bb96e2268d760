"""Where the project keeps its local state. Nothing here creates folders: callers do, when they write."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "MLOPS_HOME"
# Roots a team points at a shared filesystem, so a worker on another machine finds a snapshot by its id and
# a resumed run finds its checkpoints.
SNAPSHOTS_ENV = "MLOPS_SNAPSHOTS_DIR"
CHECKPOINTS_ENV = "MLOPS_CHECKPOINTS_DIR"


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


def _root(env: str, default: Path) -> Path:
    explicit = os.environ.get(env, "").strip()
    return Path(explicit).expanduser().resolve() if explicit else default


def snapshots_dir() -> Path:
    """Where snapshots live: MLOPS_SNAPSHOTS_DIR (a shared filesystem), else .mlops/snapshots."""
    return _root(SNAPSHOTS_ENV, mlops_dir() / "snapshots")


def checkpoints_dir() -> Path:
    """Where checkpoints live by default: MLOPS_CHECKPOINTS_DIR (a shared filesystem), else .mlops/checkpoints."""
    return _root(CHECKPOINTS_ENV, mlops_dir() / "checkpoints")


def artifact_cache_dir() -> Path:
    """Copies of artifacts from a remote store (a tracking server's `mlflow-artifacts:`, S3, ...), one per URI."""
    return mlops_dir() / "cache" / "artifacts"


def runs_dir() -> Path:
    return mlops_dir() / "runs"
