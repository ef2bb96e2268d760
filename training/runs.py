"""Which MLflow run a training run logs to: the launcher's, the checkpoint's (a resume continues its run), the
one `mlflow run` created, or a new one. Only rank 0 talks to the store."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from training.prepare import FINAL, Prepared

log = logging.getLogger(__name__)
RUN_ID_ENV = "MLOPS_TRAIN_RUN_ID"  # set by the multi-process launcher so every rank joins one run


def open_tracker(prep: Prepared, rank: int, given=None):
    from mlops.lineage import Tag
    from training.metrics import NullTracker

    run_id = os.environ.get(RUN_ID_ENV) or prep.resume_manifest.get("run_id")
    if rank != 0:
        return NullTracker(getattr(given, "run_id", None) or run_id or "none")
    from mlops.tracking import RUN_ID_ENV as MLFLOW_RUN_ENV
    from mlops.tracking import MlflowTracker

    cfg = prep.cfg
    name = cfg.run.run_name or f"train-{cfg.train.mode}-{cfg.base_model}"
    tags = prep.lineage.as_tags()
    if run_id:
        try:
            tracker = MlflowTracker.start(cfg.run.experiment, run_name=name, tags=tags, resume_run_id=run_id)
        except Exception as err:  # noqa: BLE001 - the old run is gone (another store): start a new one
            log.warning("cannot continue MLflow run %s (%s); starting a new run", run_id, err)
            tags = {**tags, Tag.SOURCE_RUN: run_id}
        else:
            created = os.environ.get(MLFLOW_RUN_ENV)
            if created and created != run_id:
                # `mlflow run` made a fresh run, but a resume continues the checkpoint's run: point to it.
                MlflowTracker(tracker.client, created, tracker.uri).set_tags({**tags, Tag.SOURCE_RUN: run_id})
            return tracker
    return MlflowTracker.start(cfg.run.experiment, run_name=name, tags=tags)


def already_done(prep: Prepared, tracker, rank: int):
    from mlops.lineage import Tag
    from training.trainer import TrainResult

    done = prep.completed
    result = TrainResult(done["run_id"], "FINISHED", done["steps"], done.get("metrics", {}),
                         Path(done["model_dir"]) if done.get("model_dir") else None, done.get("model_uri"),
                         Path(done["checkpoint"]) if done.get("checkpoint") else None)
    log.warning("this exact config already trained in run %s; returning its result (%s)", result.run_id,
                prep.ckpt_dir / FINAL)
    from mlops.tracking import RUN_ID_ENV as MLFLOW_RUN_ENV

    if tracker is None and rank == 0 and os.environ.get(MLFLOW_RUN_ENV, result.run_id) != result.run_id:
        from mlops.tracking import MlflowTracker

        tracker = MlflowTracker.start(prep.cfg.run.experiment)  # the run `mlflow run` created for this rerun
    if tracker is not None and rank == 0 and tracker.run_id != result.run_id:
        tracker.set_tags({**prep.lineage.as_tags(), Tag.SOURCE_RUN: result.run_id})
        tracker.log_metrics({k: v for k, v in result.metrics.items() if isinstance(v, int | float)}, result.steps)
        tracker.close("FINISHED")
    return result
