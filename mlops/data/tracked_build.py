"""`run_build`: a snapshot build as a tracked MLflow run with lineage tags, shared by `mlops data build`, `mlops data
harvest accept --build` and the evaluation loop.

It sits below both CLI modules (mlops.data.cli registers mlops.data.harvest_cli's commands, and both run a
build), so neither has to import the other for it; its imports are function-local so loading a CLI stays cheap.
"""

from __future__ import annotations


def run_build(cfg, *, force: bool = False):
    """The build as a tracked run with lineage tags; returns the BuildResult. SIGTERM ends it as KILLED, and
    runs a SIGKILLed build left RUNNING on this host are marked KILLED first (every stage run records its host
    and process, and the reaper runs when a stage starts: mlops.reaper)."""
    from mlops.config import config_hash
    from mlops.data.build import build_snapshot, sigterm_raises
    from mlops.lineage import Tag, collect_lineage, enforce_release
    from mlops.tracking import tracked_run

    with sigterm_raises():
        lineage = collect_lineage(config_hash(cfg), cfg.run.seed, base_model=cfg.base_model,
                                  extra={Tag.STAGE: "data"})
        enforce_release(lineage, cfg.run.release)
        with tracked_run(cfg.run.experiment, run_name=cfg.run.run_name or f"data-{cfg.data.name}",
                         tags=lineage.as_tags()) as tracker:
            result = build_snapshot(cfg, tracker, force=force)
            return result, tracker.run_id
