"""Full-state checkpoints that explain themselves: DeepSpeed files plus a manifest written last.

Layout: `<dir>/step-00000040/` holds DeepSpeed's `mp_rank_00_model_states.pt` (module, scheduler, client
state) and one `zero_pp_rank_<r>_..._optim_states.pt` per rank under ZeRO >= 1, then `manifest.json` with the
lineage, the resolved config, the data position, and every file's size and sha256. Each save is written into
`.partial-<tag>/`, fsynced, given its manifest and only then renamed to `<tag>/`: a kill or a full disk mid-save
leaves the previous checkpoint as the newest, intact one. Checkpoints that fail verification are moved to
`corrupt/`, never deleted.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mlops.errors import MLOpsError
from mlops.files import atomic_write_json, file_sha256

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
REJECTED = "manifest.rejected.json"
TAG_RE = re.compile(r"^step-(\d{8})$")
UNIVERSAL = "universal"
PARTIAL = ".partial-"  # a save in progress; renamed to its tag once its manifest is on disk
CORRUPT = "corrupt"  # checkpoints that failed verification are moved here, never deleted


def tag_for(step: int) -> str:
    return f"step-{step:08d}"


def atomic_json(path: Path, obj: dict) -> None:
    """A durable JSON write (fsynced file and folder): what marks a checkpoint or run as complete."""
    atomic_write_json(path, obj, fsync=True)


# --------------------------------------------------------------------------- RNG of every rank


def rng_state() -> bytes:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return pickle.dumps(state)


def set_rng_state(blob: bytes) -> None:
    import numpy as np
    import torch

    state = pickle.loads(blob)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_rng() -> list[bytes]:
    """Every rank's RNG state, on every rank (client_state is written by rank 0 alone)."""
    import torch.distributed as dist

    states: list = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state())
    return states


# --------------------------------------------------------------------------- manifests


def file_table(folder: Path) -> dict[str, dict]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST, REJECTED))
    return {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in files}


def read_manifest(folder: Path) -> dict | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("complete") is True else None


def verify(folder: Path) -> tuple[bool, str]:
    """(ok, reason): the manifest is complete and every file has its recorded size and sha256."""
    manifest = read_manifest(folder)
    if manifest is None:
        return False, "no complete manifest (interrupted save)"
    for name, meta in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            return False, f"'{name}' is missing"
        if path.stat().st_size != meta["size"]:
            return False, f"'{name}' has {path.stat().st_size} bytes, the manifest says {meta['size']}"
        if file_sha256(path) != meta["sha256"]:
            return False, f"'{name}' fails its sha256 check"
    if not manifest.get("files"):
        return False, "the manifest lists no files"
    return True, ""


def list_tags(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """Checkpoint folders, newest step first (complete or not)."""
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if p.is_dir() and (m := TAG_RE.match(p.name))]
    return sorted(found, reverse=True)


class CorruptCheckpoints(MLOpsError):
    """Checkpoints exist and none of them verifies: resuming would silently start over."""

    def __init__(self, ckpt_dir: Path, failures: list[dict]) -> None:
        self.failures = failures
        listing = "; ".join(f"{f['tag']}: {f['reason']}" for f in failures)
        super().__init__(
            f"none of the {len(failures)} checkpoints in {ckpt_dir} verifies ({listing}). They were moved to "
            f"{ckpt_dir / CORRUPT}/ for inspection, nothing was deleted. Fix: restore a good copy of a checkpoint "
            "into the folder and rerun, or start over on purpose with train.checkpoint.resume=none."
        )


def quarantine(folder: Path) -> Path:
    """Move a checkpoint that failed verification under `corrupt/` (never delete it)."""
    target = folder.parent / CORRUPT / f"{folder.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    target.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    while target.exists():
        n += 1
        target = target.with_name(f"{target.name.split('~')[0]}~{n}")
    os.replace(folder, target)
    return target


def select_resume(ckpt_dir: Path, warn=log.warning) -> tuple[Path, dict] | None:
    """The newest checkpoint whose manifest is complete and whose hashes verify. Newer ones that fail are moved
    to `corrupt/`; when every checkpoint fails, CorruptCheckpoints (a rerun must not quietly start over)."""
    failures: list[dict] = []
    for _, folder in list_tags(ckpt_dir):
        if not (folder / MANIFEST).exists():
            continue  # never completed (a save killed by an older version): retention removes it
        ok, reason = verify(folder)
        if ok:
            return folder, read_manifest(folder) or {}
        run_id = _manifest_field(folder, "run_id")
        moved = quarantine(folder)
        warn(f"skipping checkpoint {folder}: {reason}; moved to {moved}")
        failures.append({"tag": folder.name, "reason": reason, "moved_to": str(moved), "run_id": run_id})
    if failures:
        raise CorruptCheckpoints(ckpt_dir, failures)
    return None


def _manifest_field(folder: Path, key: str):
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def retention(ckpt_dir: Path, keep_last: int, keep_every: int | None, protect: tuple[Path, ...] = ()) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints (plus multiples of `keep_every`, plus the
    `protect`ed ones: the one just written, the selected best), every incomplete folder older than the newest
    complete one, and leftovers of interrupted saves. Returns what was deleted."""
    tags = list_tags(ckpt_dir)
    complete = [(s, p) for s, p in tags if read_manifest(p) is not None]
    keep = {p for _, p in complete[:keep_last]}
    keep |= {p for s, p in complete if keep_every and s % keep_every == 0}
    newest = complete[0][0] if complete else -1
    doomed = [p for s, p in tags if p not in keep and p not in protect and (read_manifest(p) is not None or s <= newest)]
    for folder in doomed:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(ckpt_dir / UNIVERSAL / folder.name, ignore_errors=True)
    return doomed


def remove_partials(ckpt_dir: Path) -> None:
    """Interrupted saves never became checkpoints; only the folder's lock holder may call this."""
    if ckpt_dir.is_dir():
        for folder in ckpt_dir.glob(f"{PARTIAL}*"):
            shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- other world sizes


def to_universal(folder: Path) -> tuple[Path, str]:
    """Convert a ZeRO checkpoint with DeepSpeed's ds_to_universal; returns (load_dir, tag) for load_checkpoint."""
    out_root = folder.parent / UNIVERSAL
    out = out_root / folder.name
    marker = out / ".complete"
    if not marker.exists():
        shutil.rmtree(out, ignore_errors=True)
        out_root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(folder),
               "--output_folder", str(out), "--num_extract_workers", "1", "--num_merge_workers", "1"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"})
        if proc.returncode != 0:
            raise MLOpsError(
                f"converting checkpoint {folder} to a universal checkpoint failed: {proc.stderr[-1500:]}. "
                "Fix: resume at the world size it was written with (see its manifest.json)."
            )
        marker.write_text("ok\n")
    return out_root, folder.name
