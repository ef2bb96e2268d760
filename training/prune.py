"""`mlops train checkpoints prune`: after release, delete the raw checkpoints no registered version needs.

A checkpoint folder (one config's `<ckpt_dir>`) is released when its run wrote `final.json` with status
FINISHED, nobody holds its lock, and no checkpoint is newer than the final step (a later run that trained on
and may resume). In a released folder the selected best (final.json's `checkpoint`) and every checkpoint a
registered version names stay; every other `step-*` folder goes with its `universal/<tag>` copy. `corrupt/`,
`incidents/`, final.json, ledgers and traces are never touched. `plan_prune` only reads; `apply` deletes under
the folder's train lock, after checking the plan still holds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mlops.lineage import Tag
from training.checkpoint import CORRUPT, PARTIAL, TAG_RE, UNIVERSAL, list_tags, read_manifest
from training.lock import LOCK_FILE, WORKERS_DIR, AlreadyTraining, TrainLock
from training.results import FINAL

NOT_SCANNED = {UNIVERSAL, CORRUPT, "incidents", WORKERS_DIR}
MANIFEST_URI = re.compile(r"/checkpoints/(step-\d{8})/manifest\.json$")


@dataclass(frozen=True)
class VersionRecord:
    model: str
    version: str
    run_id: str | None
    tags: dict

    @property
    def label(self) -> str:
        return f"models:/{self.model}/{self.version}"


@dataclass
class FolderPlan:
    folder: Path
    run_id: str | None = None
    skipped: str | None = None  # why nothing in this folder is touched
    keep: dict[str, list[str]] = field(default_factory=dict)  # tag -> why
    delete: dict[str, list[Path]] = field(default_factory=dict)  # tag -> the step folder and its universal copy
    sizes: dict[str, int] = field(default_factory=dict)


@dataclass
class Plan:
    root: Path
    folders: list[FolderPlan]
    notes: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(sum(f.sizes.values()) for f in self.folders)

    def as_dict(self) -> dict:
        return {"root": str(self.root), "bytes": self.bytes, "notes": self.notes, "folders": [
            {"folder": str(f.folder), "run_id": f.run_id, "skipped": f.skipped, "keep": f.keep,
             "delete": {t: [str(p) for p in ps] for t, ps in f.delete.items()}, "sizes": f.sizes} for f in self.folders]}


def checkpoint_folders(root: Path) -> list[Path]:
    """Every folder under `root` (itself included, team prefixes and smoke folders too) holding `step-*` folders."""
    found: list[Path] = []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return found
    if any(TAG_RE.match(p.name) for p in children):
        found.append(root)
    for child in children:
        if not (TAG_RE.match(child.name) or child.name in NOT_SCANNED or child.name.startswith(".")):
            found += checkpoint_folders(child)
    return found


def _read_json(folder: Path, name: str = FINAL) -> dict | None | str:
    """final.json (or the lock record): None when absent, a reason string when unreadable."""
    try:
        final = json.loads((folder / name).read_text(encoding="utf-8") or "{}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        return f"{name} is unreadable ({err})"
    return final if isinstance(final, dict) else f"{name} holds no JSON object"


def _run_ids(folder: Path, final) -> set[str]:
    ids = {m.get("run_id") for _, p in list_tags(folder) if (m := read_manifest(p))}
    return {i for i in ids | {final.get("run_id") if isinstance(final, dict) else None} if i}


def _needs(versions: list[VersionRecord], folders: list[Path], root: Path):
    """({folder: {tag: [why]}}, {folder: [why the needed checkpoint is unknown]}, notes) from the versions' tags."""
    finals = {f: _read_json(f) for f in folders}
    by_path = {f.resolve(): f for f in folders}
    by_run: dict[str, list[Path]] = {}
    for f in folders:
        for run_id in _run_ids(f, finals[f]):
            by_run.setdefault(run_id, []).append(f)
    needs: dict[Path, dict[str, list[str]]] = {}
    unknown: dict[Path, list[str]] = {}
    notes: list[str] = []
    for v in versions:
        run_id = v.tags.get(Tag.SOURCE_RUN) or v.run_id
        named = (v.tags.get(Tag.SELECTED_CHECKPOINT) or "").strip()
        ran_in = by_run.get(run_id, []) if run_id else []
        if named:
            path = Path(named).expanduser()
            exact = by_path.get(path.parent.resolve())
            # The same layout under another mount: the folder's path below the root ends the named path.
            tail = [f for f in folders if 0 < len(rel := f.relative_to(root).parts) < len(path.parts)
                    and path.parts[-len(rel) - 1:-1] == rel]
            hits = [exact] if exact else ran_in or tail
            if not hits:
                notes.append(f"{v.label} names checkpoint {named}, which is not under {root}")
            for f in hits:
                if not TAG_RE.match(path.name):
                    unknown.setdefault(f, []).append(f"{v.label} has {Tag.SELECTED_CHECKPOINT}={named!r}, not a "
                                                     "step-XXXXXXXX folder")
                    continue
                needs.setdefault(f, {}).setdefault(path.name, []).append(f"named by {v.label}")
                if not (f / path.name).is_dir():
                    notes.append(f"{v.label} names checkpoint {path.name} of {f}, which is no longer there")
        elif run_id and ran_in:
            final = {f: finals[f] for f in ran_in if isinstance(finals[f], dict) and finals[f].get("run_id") == run_id}
            uri = MANIFEST_URI.search(v.tags.get(Tag.CHECKPOINT_MANIFEST) or "")
            for f in ran_in:
                tag = Path(str(final[f].get("checkpoint") or "")).name if f in final else uri.group(1) if uri else ""
                if TAG_RE.match(tag):
                    needs.setdefault(f, {}).setdefault(tag, []).append(f"named by {v.label} (via run {run_id})")
                    if not (f / tag).is_dir():
                        notes.append(f"{v.label} needs checkpoint {tag} of {f} (via run {run_id}), which is no "
                                     "longer there")
                else:
                    unknown.setdefault(f, []).append(
                        f"{v.label} (run {run_id}) has no {Tag.SELECTED_CHECKPOINT} and its checkpoint cannot be "
                        f"told from {FINAL} or {Tag.CHECKPOINT_MANIFEST}")
        elif run_id and Tag.CHECKPOINT_MANIFEST in v.tags:
            notes.append(f"{v.label}: no checkpoint folder under {root} holds its run {run_id}")
    return needs, unknown, notes


def _size(path: Path) -> int:
    total = 0
    for top, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total


def _plan_folder(folder: Path, needs: dict[str, list[str]], unknown: list[str], ours: bool = False) -> FolderPlan:
    """`ours`: this process holds the folder's lock (apply's second look)."""
    plan = FolderPlan(folder)
    final = _read_json(folder)
    holder = None if ours else TrainLock(folder).holder()
    last = {} if ours else _read_json(folder, LOCK_FILE)
    tags = list_tags(folder)
    if holder:
        plan.skipped = f"run in progress: {holder}"
    elif isinstance(last, dict) and last.get("pid") and not last.get("released"):
        plan.skipped = (f"its last trainer (pid {last['pid']} on host {last.get('host')}, run {last.get('run_id')}) "
                        "died without releasing the lock: a killed run that will resume needs its newest checkpoint. "
                        "Fix: resume it (or let it finish), then prune")
    elif final is None:
        plan.skipped = (f"no {FINAL}: a run in progress or a killed run that will resume (it needs its newest "
                        "checkpoint)")
    elif isinstance(final, str):
        plan.skipped = final
    elif final.get("status") != "FINISHED":
        plan.skipped = f"{FINAL} has status={final.get('status')!r}, not FINISHED"
    if plan.skipped:
        return plan
    plan.run_id = final.get("run_id")
    selected = Path(str(final.get("checkpoint") or "")).name
    steps = final.get("steps")
    if not TAG_RE.match(selected):
        plan.skipped = f"{FINAL} has checkpoint={final.get('checkpoint')!r}, not a step-XXXXXXXX folder"
    elif not (folder / selected).is_dir():
        plan.skipped = f"the selected checkpoint {selected} ({FINAL}) is not in this folder"
    elif not isinstance(steps, int):
        plan.skipped = f"{FINAL} has steps={steps!r}, not a whole number: cannot tell whether a later run trained on"
    elif tags and tags[0][0] > steps:
        plan.skipped = (f"{tags[0][1].name} is newer than {FINAL}'s steps={steps}: a later run trained on here and "
                        "may resume from it")
    elif unknown:
        plan.skipped = "unknown what registered versions need: " + "; ".join(unknown)
    if plan.skipped:
        return plan
    plan.keep[selected] = ["selected best (final.json)"]
    universal = folder / UNIVERSAL
    for tag, why in needs.items():
        if (folder / tag).is_dir() or (universal / tag).is_dir():  # a universal copy alone still serves the version
            plan.keep.setdefault(tag, []).extend(why)
    orphans = {p.name for p in universal.iterdir() if TAG_RE.match(p.name)} if universal.is_dir() else set()
    for tag in sorted({p.name for _, p in tags} | orphans):
        if tag in plan.keep:
            continue
        if (folder / tag).is_symlink():
            plan.keep[tag] = ["a symbolic link (left alone)"]
            continue
        paths = [p for p in (folder / tag, universal / tag) if p.exists() and not p.is_symlink()]
        if not paths:
            continue
        plan.delete[tag] = paths
        plan.sizes[tag] = sum(_size(p) for p in paths)
    return plan


def plan_prune(root: Path, versions: list[VersionRecord]) -> Plan:
    """What pruning `root` would delete and keep, and why: reads the folders, deletes nothing."""
    folders = checkpoint_folders(root)
    needs, unknown, notes = _needs(versions, folders, root)
    return Plan(root, [_plan_folder(f, needs.get(f, {}), unknown.get(f, [])) for f in folders], notes)


def apply(plan: Plan) -> tuple[dict[str, int], list[str]]:
    """Delete what `plan` says, one folder at a time under its train lock, and only what a fresh look at the
    folder still dooms. Returns ({deleted path: bytes}, errors)."""
    deleted: dict[str, int] = {}
    errors: list[str] = []
    for fp in (f for f in plan.folders if f.delete):
        try:
            lock = TrainLock(fp.folder).acquire(worker_wait=0.0)
        except AlreadyTraining as err:
            errors.append(f"{fp.folder}: left alone, {err}")
            continue
        try:
            now = _plan_folder(fp.folder, fp.keep, [], ours=True)
            if now.skipped:
                errors.append(f"{fp.folder}: left alone, it changed since the dry run ({now.skipped})")
                continue
            for tag in (t for t in fp.delete if t in now.delete):
                for path in now.delete[tag]:
                    doomed = path.with_name(f"{PARTIAL}pruned-{path.name}")  # gone at once; a leftover is a partial
                    try:
                        size = _size(path)
                        os.replace(path, doomed)
                        shutil.rmtree(doomed)
                        deleted[str(path)] = size
                    except OSError as err:
                        errors.append(f"{path}: could not delete it ({err})")
        finally:
            lock.release()
    return deleted, errors


def registered_versions() -> list[VersionRecord]:
    """Every version of every registered model (paged), with its tags: what prune must not delete from under."""
    from mlops.tracking import call, client

    c = client()
    found: list[VersionRecord] = []
    token = None
    while True:
        page = call("the registered model versions", lambda t=token: c.search_model_versions(
            max_results=1000, page_token=t))
        found += [VersionRecord(v.name, str(v.version), v.run_id, dict(v.tags or {})) for v in page]
        token = getattr(page, "token", None)
        if not token:
            return found


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def describe(plan: Plan, deleted: dict[str, int] | None = None, errors: list[str] = ()) -> str:
    """The plan for a person: per folder what goes (with sizes) and what stays and why; then the total."""
    lines = [f"checkpoints under {plan.root}" + ("" if deleted is not None else " (dry run: nothing deleted; "
                                                 "--apply deletes)")]
    for f in plan.folders:
        name = f.folder.relative_to(plan.root).as_posix() if f.folder != plan.root else "."
        if f.skipped:
            lines.append(f"{name}: skipped whole, {f.skipped}")
            continue
        lines.append(f"{name} (run {f.run_id}):")
        lines += [f"  {'keep':<7} {tag}  {'; '.join(why)}" for tag, why in sorted(f.keep.items())]
        for tag, paths in sorted(f.delete.items()):
            verb = "delete" if deleted is None else "deleted" if all(str(p) in deleted for p in paths) else "kept"
            lines.append(f"  {verb:<7} {tag}  {_human(f.sizes[tag])}"
                         + ("  (with its universal copy)" if len(paths) > 1 else ""))
    lines += [f"note: {n}" for n in plan.notes] + [f"error: {e}" for e in errors]
    count = sum(len(f.delete) for f in plan.folders)
    if deleted is None:
        lines.append(f"would free {_human(plan.bytes)} in {count} checkpoints")
    else:
        lines.append(f"freed {_human(sum(deleted.values()))} ({len(deleted)} folders deleted)")
    return "\n".join(lines)
