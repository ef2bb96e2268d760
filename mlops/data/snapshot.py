"""Finding and checking snapshots by id. The format itself is described in mlops.data.format.

    resolve_snapshot(snapshot_id) -> Path    # .mlops/snapshots/<id>/, only if its manifest is complete
    verify_snapshot(id_or_path) -> dict      # re-hash every file; MLOpsError names the changed file
    list_snapshots() -> list[dict]           # complete snapshots, newest first
"""

from __future__ import annotations

from pathlib import Path

from mlops.data.format import read_manifest, verify_files
from mlops.errors import MLOpsError, NotFoundError, did_you_mean


def _root(root: Path | None) -> Path:
    from mlops.paths import snapshots_dir

    return root or snapshots_dir()


def list_snapshots(root: Path | None = None) -> list[dict]:
    folder = _root(root)
    if not folder.is_dir():
        return []
    found = [m for p in folder.iterdir() if p.is_dir() and (m := read_manifest(p)) is not None]
    return sorted(found, key=lambda m: m.get("created_at", ""), reverse=True)


def resolve_snapshot(snapshot_id: str, root: Path | None = None) -> Path:
    """The folder of a complete snapshot; a unique id prefix is accepted."""
    base = _root(root)
    snapshot_id = str(snapshot_id).strip()
    folder = base / snapshot_id
    if snapshot_id and "/" not in snapshot_id and read_manifest(folder) is not None:
        return folder
    known = [m["snapshot_id"] for m in list_snapshots(base)]
    matches = [k for k in known if snapshot_id and k.startswith(snapshot_id)]
    if len(matches) == 1:
        return base / matches[0]
    if folder.is_dir():
        raise NotFoundError(
            f"snapshot '{snapshot_id}' exists at {folder} but has no complete manifest (an interrupted build). "
            "Fix: rebuild it with `mlops data build --config ...`; the leftover folder can be deleted."
        )
    raise NotFoundError(
        f"unknown data snapshot '{snapshot_id}' under {base}: {did_you_mean(snapshot_id, known)}. "
        "Fix: build one with `mlops data build --config <yaml>` or list them with `mlops data list`."
    )


def snapshot_path(snapshot_id_or_path: str | Path, root: Path | None = None) -> Path:
    candidate = Path(snapshot_id_or_path)
    if candidate.is_dir() and (candidate / "manifest.json").exists():
        return candidate
    return resolve_snapshot(str(snapshot_id_or_path), root)


def verify_snapshot(snapshot_id_or_path: str | Path, root: Path | None = None) -> dict:
    """Re-hash every file against the manifest; raises MLOpsError naming each changed, missing or extra file."""
    folder = snapshot_path(snapshot_id_or_path, root)
    manifest = read_manifest(folder)
    if manifest is None:
        raise MLOpsError(f"'{folder}' has no complete manifest. Fix: rebuild the snapshot.")
    problems = verify_files(folder, manifest)
    if problems:
        sid = manifest["snapshot_id"]
        raise MLOpsError(
            f"snapshot {sid} at {folder} failed verification: {'; '.join(problems)}. Fix: a snapshot is immutable; "
            f"rebuild it in place with `mlops data rebuild {sid}` (it rebuilds from the config recorded in its "
            "manifest and replaces the damaged folder), or `mlops data build --config <yaml> --force`."
        )
    return {"snapshot_id": manifest["snapshot_id"], "path": str(folder), "files": len(manifest.get("files", {})),
            "ok": True}
