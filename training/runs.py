"""Which MLflow run a training run logs to, and how runs that died are accounted for. Only rank 0 (or the
launcher of a multi-process run) talks to the store.

* A resume with the checkpoint's exact config continues the checkpoint's run (a run keeps its config hash).
* A resume with changed settings is a new run (new hash) tagged with the run it continues, which is closed
  if it was left RUNNING.
* `run.json` in the checkpoint folder names the folder's current run, so a run killed before its first
  checkpoint is closed KILLED by the next start instead of staying RUNNING forever.
* While it trains, rank 0 stamps a heartbeat tag: a run whose heartbeat stopped is dead (the reaper's cue).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from training.prepare import Prepared
from training.results import FINAL

log = logging.getLogger(__name__)
RUN_ID_ENV = "MLOPS_TRAIN_RUN_ID"  # set by the multi-process launcher so every rank joins one run
RUN_FILE = "run.json"


def open_tracker(prep: Prepared, rank: int, given=None):
    """The run this process logs to: `given` when a caller passed one, else chosen as the module says."""
    from training.metrics import NullTracker

    resumed_run = prep.resume_manifest.get("run_id") if prep.resume_from else None
    same_run = resumed_run and prep.resume_manifest.get("config_hash") == prep.config_hash
    if rank != 0:
        return NullTracker(getattr(given, "run_id", None) or os.environ.get(RUN_ID_ENV) or resumed_run or "none")
    if given is not None:
        tracker = given
    elif os.environ.get(RUN_ID_ENV):
        return _attach(prep, os.environ[RUN_ID_ENV])  # a worker of a multi-process run: the launcher chose
    else:
        tracker = _choose(prep, resumed_run if same_run else None)
    _account_for_previous(prep, tracker, resumed_run, same_run)
    return tracker


def _attach(prep: Prepared, run_id: str):
    from mlops.tracking import MlflowTracker

    return MlflowTracker.start(prep.cfg.run.experiment, resume_run_id=run_id, attach_env_run=False)


def _choose(prep: Prepared, continue_run: str | None):
    from mlops.lineage import Tag
    from mlops.tracking import RUN_ID_ENV as MLFLOW_RUN_ENV
    from mlops.tracking import MlflowTracker

    cfg = prep.cfg
    name = run_name(cfg)
    tags = prep.lineage.as_tags()
    if continue_run:
        try:
            tracker = MlflowTracker.start(cfg.run.experiment, run_name=name, tags=tags, resume_run_id=continue_run)
        except Exception as err:  # noqa: BLE001 - the old run is gone (another store): start a new one
            log.warning("cannot continue MLflow run %s (%s); starting a new run", continue_run, err)
            tags = {**tags, Tag.SOURCE_RUN: continue_run}
        else:
            created = os.environ.get(MLFLOW_RUN_ENV)
            if created and created != continue_run:
                # `mlflow run` made a fresh run, but a resume continues the checkpoint's run: point to it.
                MlflowTracker(tracker.client, created, tracker.uri).set_tags({**tags, Tag.SOURCE_RUN: continue_run})
            return tracker
    return MlflowTracker.start(cfg.run.experiment, run_name=name, tags=tags)


def _account_for_previous(prep: Prepared, tracker, resumed_run: str | None, same_run: bool) -> None:
    """Link a new run to the run it continues; close runs of this folder that were left RUNNING."""
    from mlops.lineage import Tag

    if resumed_run and not same_run and resumed_run != tracker.run_id:
        tracker.set_tags({Tag.PREVIOUS_RUN: resumed_run})
        close_if_running(resumed_run, "KILLED", f"continued as run {tracker.run_id} from {prep.resume_from} with "
                                                "changed settings (see its resume.json)")
    recorded = _read_run_file(prep.ckpt_dir)
    orphan = recorded.get("run_id")
    if orphan and orphan not in (tracker.run_id, resumed_run):
        step = f" at step {recorded.get('step')}" if recorded.get("step") else ""
        if close_if_running(orphan, "KILLED", f"stopped{step} before its first checkpoint; superseded by run "
                                              f"{tracker.run_id}, which started over in {prep.ckpt_dir}"):
            tracker.set_tags({Tag.PREVIOUS_RUN: orphan})
    write_run_file(prep.ckpt_dir, tracker.run_id, prep.config_hash)


def _read_run_file(folder: Path) -> dict:
    try:
        data = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_run_file(folder: Path, run_id: str, config_hash: str) -> None:
    from training.checkpoint import atomic_json
    from training.lock import process_identity

    folder.mkdir(parents=True, exist_ok=True)
    atomic_json(folder / RUN_FILE, {"run_id": run_id, "config_hash": config_hash, **process_identity(),
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def close_if_running(run_id: str, status: str, reason: str) -> bool:
    """Close a run of the tracking store that is still RUNNING (a process that died cannot close its own)."""
    try:
        from mlops.tracking import MlflowTracker

        tracker = MlflowTracker.existing(run_id)
        if tracker.status() != "RUNNING":
            return False
        tracker.close(status, reason=reason[:4000])
        return True
    except Exception as err:  # noqa: BLE001 - a run of another store, or a store that is down
        log.warning("could not close run %s: %s", run_id, err)
        return False


def run_name(cfg) -> str:
    """A training run's name in the MLflow UI: `run.run_name`, else by stage, mode and base model."""
    return cfg.run.run_name or f"train-{cfg.train.mode}-{cfg.base_model}"


def already_done(prep: Prepared, tracker, rank: int):
    from mlops.lineage import Tag
    from training.results import TrainResult

    done = prep.completed
    result = TrainResult(done["run_id"], "FINISHED", done["steps"], done.get("metrics", {}),
                         Path(done["model_dir"]) if done.get("model_dir") else None, done.get("model_uri"),
                         Path(done["checkpoint"]) if done.get("checkpoint") else None)
    log.warning("this exact config already trained in run %s; returning its result (%s)", result.run_id,
                prep.ckpt_dir / FINAL)
    from mlops.tracking import RUN_ID_ENV as MLFLOW_RUN_ENV

    if tracker is None and rank == 0 and os.environ.get(MLFLOW_RUN_ENV, result.run_id) != result.run_id:
        from mlops.tracking import MlflowTracker

        # The run `mlflow run` created for this rerun: named for what it is, pointing at the run that trained.
        tracker = MlflowTracker.start(prep.cfg.run.experiment, run_name=f"{run_name(prep.cfg)} (already trained)")
    if tracker is not None and rank == 0 and tracker.run_id != result.run_id:
        tracker.set_tags({**prep.lineage.as_tags(), Tag.SOURCE_RUN: result.run_id})
        tracker.log_metrics({k: v for k, v in result.metrics.items() if isinstance(v, int | float)}, result.steps)
        tracker.close("FINISHED")
    return result


class Heartbeat:
    """Stamps `Tag.HEARTBEAT` (unix seconds) on the run every `interval` seconds from a daemon thread, and keeps
    MLflow's system-metrics monitor running on it (`train.system_metrics_seconds`)."""

    def __init__(self, tracker, interval: float, system_metrics_s: float | None = None) -> None:
        self.tracker, self.interval = tracker, interval
        self.system_metrics_s = system_metrics_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop_system = None

    def beat(self) -> None:
        from mlops.lineage import Tag

        try:
            self.tracker.set_tags({Tag.HEARTBEAT: str(int(time.time()))})
        except Exception as err:  # noqa: BLE001 - a missed beat must never stop training
            log.warning("heartbeat for run %s failed: %s", self.tracker.run_id, err)

    def start(self) -> Heartbeat:
        self.beat()
        if self.system_metrics_s:
            try:
                self._stop_system = self.tracker.watch_system(self.system_metrics_s)
            except Exception as err:  # noqa: BLE001 - a monitor that cannot start must never stop training
                log.warning("system metrics for run %s are off: %s", self.tracker.run_id, err)
        self._thread = threading.Thread(target=self._run, name="train-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def stop(self) -> None:
        self._stop.set()
        if self._stop_system is not None:
            self._stop_system()
            self._stop_system = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
