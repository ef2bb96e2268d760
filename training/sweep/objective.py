"""How a trial trains and what it scores: the training stage's own `train()` (no second loop), its smoke
check, and the objective value taken from the trainer's metrics or from a deployment-form eval run."""

from __future__ import annotations

import math
from typing import Any, Protocol

from mlops.errors import ConfigError, MLOpsError


class Trainer(Protocol):
    """What the sweep needs from the training stage. Tests inject a fake with the same shape."""

    stop_exception: type[BaseException]

    def train(self, cfg, tracker, report) -> Any: ...  # -> TrainResult (run_id, status, metrics, model_uri)
    def smoke(self, cfg, tracker) -> Any: ...  # raises when the config does not train
    def shutdown(self) -> None: ...


class StageTrainer:
    """`training.trainer.train` in this process, one trial after another."""

    def __init__(self) -> None:
        self._verified: set[str] = set()

    @property
    def stop_exception(self) -> type[BaseException]:
        from training.trainer import StopTraining

        return StopTraining

    def _prepared(self, cfg, *, smoke: bool):
        from training.engine import init_world
        from training.prepare import prepare

        world = init_world(cfg.train.deepspeed.backend)
        # The snapshot's files are hashed once per process; later trials on it skip the re-hash.
        prep = prepare(cfg, world.size, smoke=smoke, verify_inputs=cfg.train.snapshot not in self._verified)
        self._verified.add(prep.snapshot_id)
        return prep

    def train(self, cfg, tracker, report):
        from training.trainer import train

        return train(cfg, tracker, report=report, prepared=self._prepared(cfg, smoke=False))

    def smoke(self, cfg, tracker):
        """The training stage's smoke run (`mlops train run --smoke true`): a few dozen steps that must lower
        the loss at the configured speed; raises SmokeFailed otherwise."""
        from training.trainer import train

        return train(cfg, tracker, prepared=self._prepared(cfg, smoke=True))

    def shutdown(self) -> None:
        from training.launch import shutdown_world

        shutdown_world()


def is_simulated_crash(err: BaseException) -> bool:
    """train.debug.crash_after_step raises a BaseException meant to look like a kill; in a sweep worker it is
    a crashed trial, recorded as such, and the study goes on."""
    return type(err).__name__ == "SimulatedCrash"


# --------------------------------------------------------------------------- eval objectives


def check_eval_objective(suite: str, metric: str) -> None:
    """An eval objective names a registered suite and a metric that suite's tasks report."""
    try:
        from evaluation.suites import discover
    except ImportError:
        raise ConfigError(f"sweep.objective='eval/{suite}/{metric}' needs the evaluation stage, which is not "
                          "installed here. Fix: use a trainer metric such as val_loss.") from None
    from mlops.errors import NotFoundError

    try:
        found = discover().get(suite)
    except NotFoundError as err:
        raise ConfigError(f"sweep.objective='eval/{suite}/{metric}': {err}. Fix: name a registered suite.") from None
    known = sorted({t.primary for t in found.tasks} | {"score"})
    if metric not in known:
        raise ConfigError(f"sweep.objective='eval/{suite}/{metric}': suite '{suite}' reports {', '.join(known)}. "
                          "Fix: pick one of those metrics.")
    _eval_runner()


def _eval_runner():
    try:
        from evaluation.run import evaluate_model  # noqa: F401
    except ImportError:
        raise ConfigError("eval objectives need the evaluation stage's `evaluation.run.evaluate_model`, which this "
                          "checkout lacks. Fix: use a trainer metric such as val_loss until it lands.") from None
    return evaluate_model


def eval_value(objective, result, cfg, tracker) -> float:
    """Run the trial's final model through the suite in deployment form and return the metric's mean."""
    if not getattr(result, "model_uri", None):
        raise MLOpsError("an eval objective needs the trial's final model, and the trainer logged none. "
                         "Fix: leave train.final_model=true in the base config.")
    suite, metric = objective.suite_metric
    scores = _eval_runner()(result.model_uri, [suite], cfg)
    value = scores.get(f"{suite}/{metric}", scores.get(metric))
    if value is None:
        raise MLOpsError(f"eval of {result.model_uri} on suite '{suite}' reported no '{metric}' "
                         f"(got {sorted(scores)}). Fix: pick a metric the suite reports.")
    tracker.log_metrics({f"objective/{objective.metric}": float(value)})
    return float(value)


def objective_value(objective, result, cfg, tracker) -> float:
    """The trial's value; raises with the reason when it is missing or not finite."""
    if objective.source == "eval":
        value = eval_value(objective, result, cfg, tracker)
    else:
        metrics = getattr(result, "metrics", {}) or {}
        if objective.metric not in metrics:
            raise MLOpsError(f"the trainer finished without the objective metric '{objective.metric}' "
                             f"(it reported {sorted(metrics)}). Fix: check the base config's validation split "
                             "(train.eval_every, the snapshot's validation samples).")
        value = float(metrics[objective.metric])
    if not math.isfinite(value):
        raise MLOpsError(f"the objective {objective.metric} is {value}: the trial diverged. Fix: narrow the "
                         "learning-rate range of the search space.")
    return value
