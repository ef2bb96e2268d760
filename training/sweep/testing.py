"""A stand-in for the training stage with the same contract, for fast sweep tests: a validation-loss curve that
depends on the learning rate, reported every `train.eval_every` steps, honouring StopTraining, NaN and crash
injection (`train.debug.*`), tagging its run with the same lineage the real trainer does."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from training.trainer import SimulatedCrash  # the trainer's own class: crashes are recognised by type


class FakeStop(Exception):
    """The fake's StopTraining."""


@dataclass
class FakeResult:
    run_id: str
    status: str
    steps: int
    metrics: dict = field(default_factory=dict)
    model_uri: str | None = None
    model_dir: Path | None = None
    stopped: bool = False
    reason: str | None = None


def fake_val_loss(lr: float, step: int, best_lr: float = 3e-3) -> float:
    """Lower is better; the best learning rate is `best_lr`, and every curve falls with the step."""
    return 1.0 + (math.log10(lr) - math.log10(best_lr)) ** 2 + 2.0 / step


class FakeTrainer:
    stop_exception = FakeStop

    def __init__(self, *, smoke_fails: bool = False, crash_calls: tuple[int, ...] = (),
                 produce: tuple[str, ...] = ("val_loss", "val_perplexity", "loss"), log_model: bool = False) -> None:
        self.smoke_fails, self.crash_calls, self.produce = smoke_fails, set(crash_calls), produce
        self.log_model = log_model
        self.calls: list = []  # configs trained, in order
        self.smoke_calls = 0
        self._env = None

    def _lineage(self, cfg, tracker) -> None:
        import dataclasses

        from mlops.config import config_hash
        from mlops.lineage import Tag, collect_lineage

        if self._env is None:  # the image tag and git state are read once: they cost ~1 s per read
            self._env = collect_lineage("", 0, extra={Tag.STAGE: "train"})
        lineage = dataclasses.replace(self._env, config_hash=config_hash(cfg), seed=cfg.run.seed,
                                      base_model=cfg.base_model, snapshot_id=cfg.train.snapshot)
        tracker.set_tags(lineage.as_tags())

    def train(self, cfg, tracker, report):
        self.calls.append(cfg)
        self._lineage(cfg, tracker)
        t = cfg.train
        val = math.nan
        try:
            if len(self.calls) in self.crash_calls:
                raise SimulatedCrash(f"fake crash in call {len(self.calls)}")
            for step in range(t.eval_every, t.max_steps + 1, t.eval_every):
                val = math.nan if t.debug.nan_at_step and step >= t.debug.nan_at_step else fake_val_loss(t.lr, step)
                metrics = {k: v for k, v in {"val_loss": val, "val_perplexity": math.exp(min(val, 50)),
                                             "loss": val}.items() if k in self.produce}
                tracker.log_metrics(metrics, step)
                if report is not None:
                    try:
                        report(step, metrics)
                    except FakeStop as why:
                        tracker.close("FINISHED")
                        return FakeResult(tracker.run_id, "STOPPED", step, metrics, stopped=True, reason=str(why))
        except SimulatedCrash:
            raise  # like a kill: the run is left as it is
        except BaseException as err:
            tracker.close("FAILED", reason=f"{type(err).__name__}: {err}")
            raise
        metrics = {k: v for k, v in {"val_loss": val, "loss": val, "steps": t.max_steps}.items()
                   if k in self.produce or k == "steps"}
        tracker.log_metrics(metrics, t.max_steps)
        tracker.close("FINISHED")
        uri = f"runs:/{tracker.run_id}/model" if self.log_model else None
        return FakeResult(tracker.run_id, "FINISHED", t.max_steps, metrics, model_uri=uri)

    def smoke(self, cfg, tracker):
        from mlops.errors import MLOpsError

        self.smoke_calls += 1
        self._lineage(cfg, tracker)
        if self.smoke_fails:
            tracker.close("FAILED", reason="smoke run failed: the loss did not fall")
            raise MLOpsError("smoke run failed: the loss did not fall by 5% (first steps 6.0, last steps 6.0)")
        metrics = {k: 1.0 for k in (*self.produce, "loss_first", "loss_last", "steps")}
        tracker.close("FINISHED")
        return FakeResult(tracker.run_id, "FINISHED", cfg.train.smoke.steps, metrics)


def sweep_yaml(path: Path, *, base: Path | None = None, base_overrides: list[str] = (), study: str = "unit",
               params: dict | None = None, space: str = "", **sweep) -> Path:
    """Write a sweep config file for tests and benchmarks."""
    import yaml

    section = {"study": study, "space": space, "base_overrides": list(base_overrides),
               "params": params if params is not None else
               {"lr": {"key": "train.lr", "type": "float", "low": 1e-4, "high": 3e-2, "log": True}}, **sweep}
    if base is not None:
        section["base_config"] = str(base)
    data = {"run": {"experiment": f"sweep-{study}", "seed": 7}, "sweep": section}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class MemoryRuns:
    """A `start_tracker` for sweeps that keeps runs in memory (MemoryTracker), by run name, for fast tests."""

    def __init__(self) -> None:
        self.runs: dict[str, object] = {}

    def __call__(self, experiment: str, run_name: str | None, tags: dict, parent_run_id: str | None):
        import uuid

        from mlops.lineage import Tag
        from mlops.tracking import MemoryTracker

        tracker = MemoryTracker(run_id=uuid.uuid4().hex)
        tracker.experiment, tracker.name = experiment, run_name
        tracker.set_tags({**tags, **({Tag.PARENT_RUN: parent_run_id} if parent_run_id else {})})
        self.runs[run_name or tracker.run_id] = tracker
        return tracker

    def children(self, parent_run_id: str) -> dict[str, object]:
        from mlops.lineage import Tag

        return {name: t for name, t in self.runs.items() if t.tags.get(Tag.PARENT_RUN) == parent_run_id}
