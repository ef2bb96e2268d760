"""Full-state checkpoints that explain themselves: DeepSpeed files plus a manifest written last.

Layout: `<dir>/step-00000040/` holds DeepSpeed's `mp_rank_00_model_states.pt` (module, scheduler, client
state) and one `zero_pp_rank_<r>_..._optim_states.pt` per rank under ZeRO >= 1, then `manifest.json` with the
lineage, the data position, and every file's size and sha256. A folder without a complete manifest is not a
checkpoint: a kill mid-save leaves the previous complete one as the newest valid choice.
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
import threading
import time
from pathlib import Path

from mlops.data.format import file_sha256
from mlops.errors import MLOpsError

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
REJECTED = "manifest.rejected.json"
TAG_RE = re.compile(r"^step-(\d{8})$")
UNIVERSAL = "universal"


def tag_for(step: int) -> str:
    return f"step-{step:08d}"


def atomic_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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


def select_resume(ckpt_dir: Path, warn=log.warning) -> tuple[Path, dict] | None:
    """The newest checkpoint whose manifest is complete and whose hashes verify; corrupt ones are set aside."""
    for _, folder in list_tags(ckpt_dir):
        if not (folder / MANIFEST).exists():
            continue  # an interrupted save, removed by the next retention pass
        ok, reason = verify(folder)
        if ok:
            return folder, read_manifest(folder) or {}
        warn(f"skipping checkpoint {folder}: {reason}")
        # Rename rather than delete: the folder stays for inspection until retention removes it.
        os.replace(folder / MANIFEST, folder / REJECTED)
    return None


def retention(ckpt_dir: Path, keep_last: int, keep_every: int | None, protect: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints (plus multiples of `keep_every`) and every
    incomplete folder older than the newest complete one. Returns what was deleted."""
    tags = list_tags(ckpt_dir)
    complete = [(s, p) for s, p in tags if read_manifest(p) is not None]
    keep = {p for _, p in complete[:keep_last]}
    keep |= {p for s, p in complete if keep_every and s % keep_every == 0}
    newest = complete[0][0] if complete else -1
    doomed = [p for s, p in tags if p not in keep and p != protect and (read_manifest(p) is not None or s <= newest)]
    for folder in doomed:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(ckpt_dir / UNIVERSAL / folder.name, ignore_errors=True)
    return doomed


# --------------------------------------------------------------------------- saving


class Saver:
    """Saves on every rank; rank 0 then hashes, writes the manifest and prunes in a background thread, so the
    step loop waits only for DeepSpeed's own writes."""

    def __init__(self, ckpt_dir: Path, *, rank: int, keep_last: int, keep_every: int | None, exclude_frozen: bool,
                 tracker, lineage: dict, kill_in_save_step: int | None = None) -> None:
        self.dir = ckpt_dir
        self.rank = rank
        self.keep_last, self.keep_every = keep_last, keep_every
        self.exclude_frozen = exclude_frozen
        self.tracker = tracker
        self.lineage = lineage
        self.kill_in_save_step = kill_in_save_step
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_complete: Path | None = None
        self.last_save_s = 0.0

    def save(self, engine, step: int, client_state: dict, manifest_fields: dict) -> Path:
        import torch.distributed as dist

        self.wait()
        tag = tag_for(step)
        folder = self.dir / tag
        started = time.perf_counter()
        if self.rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(folder, ignore_errors=True)  # leftovers of a killed attempt at the same step
        dist.barrier()
        engine.save_checkpoint(str(self.dir), tag=tag, client_state=client_state, save_latest=False,
                               exclude_frozen_parameters=self.exclude_frozen)
        dist.barrier()
        self.last_save_s = time.perf_counter() - started
        if self.kill_in_save_step == step:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)  # fault injection: files written, manifest not yet
        if self.rank == 0:
            fields = {**self.lineage, **manifest_fields, "step": step, "tag": tag}
            self._thread = threading.Thread(target=self._finalize, args=(folder, fields), daemon=True)
            self._thread.start()
        return folder

    def _finalize(self, folder: Path, fields: dict) -> None:
        try:
            manifest = {**fields, "files": file_table(folder), "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                        time.gmtime()), "complete": True}
            atomic_json(folder / MANIFEST, manifest)
            self.last_complete = folder
            from mlops.lineage import Tag

            retention(self.dir, self.keep_last, self.keep_every, protect=folder)
            artifact = f"checkpoints/{folder.name}/{MANIFEST}"
            self.tracker.log_dict(manifest, artifact)
            # A reference every machine of the team resolves through the tracking server, not a local path.
            self.tracker.set_tags({Tag.CHECKPOINT_MANIFEST: f"runs:/{self.tracker.run_id}/{artifact}"})
        except BaseException as err:  # noqa: BLE001 - re-raised in the step loop by wait()
            self._error = err

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise MLOpsError(f"writing the checkpoint manifest failed: {err}") from err


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
