"""Writing a checkpoint durably on every rank: DeepSpeed's files into `.partial-<tag>/`, then (rank 0, in a
background thread) hashes, fsync, the manifest and the rename that commits it. A failed write on any rank
(a full disk, a quota, an I/O error) is agreed by all ranks and reported as one paragraph; the previous
checkpoint is never touched."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from mlops.errors import MLOpsError
from mlops.files import fsync_dir
from training.checkpoint import MANIFEST, PARTIAL, atomic_json, file_table, retention, tag_for

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- durable writes


def fsync_tree(folder: Path) -> None:
    """Flush every file and folder below `folder` to disk (a manifest must never outlive the data it names)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    for path in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(path)
    fsync_dir(folder)


class CheckpointWriteError(MLOpsError):
    """A checkpoint could not be written (full disk, quota, I/O error); the previous one is untouched."""


def write_failure(ckpt_dir: Path, tag: str, err: BaseException, previous: Path | None) -> CheckpointWriteError:
    enospc = isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)
    try:
        free = f"; {shutil.disk_usage(ckpt_dir).free / 2**20:.0f} MiB are free there now"
    except OSError:
        free = ""
    cause = "the disk is full" if enospc else f"{type(err).__name__}: {err}"
    kept = f"The previous checkpoint {previous.name} is intact" if previous else "No earlier checkpoint exists"
    resume = f"it resumes from {previous.name}" if previous else "it starts over"
    return CheckpointWriteError(
        f"writing checkpoint {tag} into {ckpt_dir} failed: {cause}{free}. {kept}, and the partial files of {tag} "
        f"were removed. Fix: free space on that disk, set train.checkpoint.dir to a larger one, or lower "
        f"train.checkpoint.keep_last, then rerun the same command: {resume}."
    )


# --------------------------------------------------------------------------- saving


def any_rank(flag: bool) -> bool:
    """True on every rank when it is true on any (a rank that failed alone must not leave the others waiting)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0])
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value)
    return bool(value.item() > 0)


class _CatchingWrites:
    """Wraps DeepSpeed's checkpoint engine `save`: a failed write is recorded instead of raised, so this rank
    still reaches DeepSpeed's closing barrier and every rank learns of the failure together."""

    def __init__(self, engine) -> None:
        self.ce = engine.checkpoint_engine
        self.original = self.ce.save
        self.error: BaseException | None = None

    def __enter__(self) -> _CatchingWrites:
        def save(state_dict, path):
            if self.error is None:
                try:
                    self.original(state_dict, path)
                except (OSError, RuntimeError) as err:  # torch.save reports a full disk as a RuntimeError
                    self.error = err

        self.ce.save = save
        return self

    def __exit__(self, *exc) -> None:
        self.ce.save = self.original


class Saver:
    """Saves on every rank into `.partial-<tag>`; rank 0 then hashes and fsyncs the files, writes the manifest
    and renames the folder to `<tag>` in a background thread, so the step loop waits only for DeepSpeed's own
    writes. The rename is the commit: a folder named `step-*` is always complete."""

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
        self._pending: str | None = None
        self.last_complete: Path | None = None
        self.protect: Path | None = None  # a checkpoint retention must keep besides the newest (the selected best)
        self.last_save_s = 0.0  # what the step loop waited for
        self.last_total_s = 0.0  # until the manifest was on disk (what a preemption's grace must cover)

    def save(self, engine, step: int, client_state: dict, manifest_fields: dict) -> Path:
        self.wait()
        tag = tag_for(step)
        partial = self.dir / f"{PARTIAL}{tag}"
        started = time.perf_counter()
        error: BaseException | None = None
        if self.rank == 0:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(partial, ignore_errors=True)  # leftovers of a killed attempt at the same step
            except OSError as err:
                error = err
        if any_rank(error is not None):
            raise write_failure(self.dir, tag, error or OSError("another rank failed"), self.last_complete)
        try:
            with _CatchingWrites(engine) as writes:
                engine.save_checkpoint(str(self.dir), tag=partial.name, client_state=client_state,
                                       save_latest=False, exclude_frozen_parameters=self.exclude_frozen)
            error = writes.error
        except (OSError, RuntimeError) as err:
            import torch.distributed as dist

            error = err
            dist.barrier()  # the closing barrier of save_checkpoint, which this rank skipped
        if any_rank(error is not None):
            if self.rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            raise write_failure(self.dir, tag, error or OSError("another rank could not write its shard"),
                                self.last_complete)
        self.last_save_s = time.perf_counter() - started
        if self.kill_in_save_step == step:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)  # fault injection: files written, manifest not yet
        if self.rank == 0:
            fields = {**self.lineage, **manifest_fields, "step": step, "tag": tag}
            self._pending = tag
            self._thread = threading.Thread(target=self._finalize, args=(partial, fields, started), daemon=True)
            self._thread.start()
        return self.dir / tag

    def _finalize(self, partial: Path, fields: dict, started: float) -> None:
        folder = self.dir / fields["tag"]
        try:
            manifest = {**fields, "files": file_table(partial), "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                        time.gmtime()), "complete": True}
            fsync_tree(partial)
            atomic_json(partial / MANIFEST, manifest)
            fsync_dir(partial)
            shutil.rmtree(folder, ignore_errors=True)  # a same-step checkpoint from before a restart
            os.replace(partial, folder)
            fsync_dir(self.dir)
            self.last_complete = folder
            self.last_total_s = time.perf_counter() - started
        except BaseException as err:  # noqa: BLE001 - re-raised on every rank by wait()
            shutil.rmtree(partial, ignore_errors=True)
            self._error = err
            return
        try:
            from mlops.lineage import Tag

            retention(self.dir, self.keep_last, self.keep_every, protect=(folder, *([self.protect] if self.protect else [])))
            artifact = f"checkpoints/{folder.name}/{MANIFEST}"
            self.tracker.log_dict(manifest, artifact)
            # A reference every machine of the team resolves through the tracking server, not a local path.
            self.tracker.set_tags({Tag.CHECKPOINT_MANIFEST: f"runs:/{self.tracker.run_id}/{artifact}"})
        except Exception as err:  # noqa: BLE001 - the checkpoint is committed; bookkeeping may lag
            log.warning("checkpoint %s is complete, but recording it failed: %s", folder, err)

    def wait(self) -> None:
        """Collective: every rank calls it at the same point and every rank raises if the last save failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if any_rank(error is not None):
            tag = self._pending or "the last checkpoint"
            raise write_failure(self.dir, tag, error or OSError("rank 0 could not finish it"), self.last_complete)
