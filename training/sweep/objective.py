"""How a trial trains and what it scores: the training stage's own `train()` (no second loop), its smoke
check, and the objective value taken from the trainer's metrics or from a deployment-form eval run."""

from __future__ import annotations

import math
from typing import Any, Protocol

from mlops.errors import ConfigError, MLOpsError, did_you_mean


class Trainer(Protocol):
    """What the sweep needs from the training stage. Tests inject a fake with the same shape."""

    stop_exception: type[BaseException]

    def train(self, cfg, tracker, report) -> Any: ...  # -> TrainResult (run_id, status, metrics, model_uri)
    def smoke(self, cfg, tracker) -> Any: ...  # raises when the config does not train


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
        from training.attest import attest_training
        from training.trainer import train

        result = train(cfg, tracker, report=report, prepared=self._prepared(cfg, smoke=False))
        attest_training(result.as_dict())  # whoever runs the sweep signs each trial's output (registration needs it)
        return result

    def smoke(self, cfg, tracker):
        """The training stage's smoke run (`mlops train run --smoke true`): a few dozen steps that must lower
        the loss at the configured speed; raises SmokeFailed otherwise."""
        from training.trainer import train

        return train(cfg, tracker, prepared=self._prepared(cfg, smoke=True))



def release_world() -> None:
    """At process exit (the CLI's job, never the core's): a process group torn down cannot train again."""
    import sys

    if "torch.distributed" in sys.modules:
        from training.launch import shutdown_world

        shutdown_world()


def is_simulated_crash(err: BaseException) -> bool:
    """train.debug.crash_after_step raises a BaseException meant to look like a kill; in a sweep worker it is
    a crashed trial, recorded as such, and the study goes on."""
    from training.trainer import SimulatedCrash

    return isinstance(err, SimulatedCrash)


# --------------------------------------------------------------------------- eval objectives


def _suite(name: str):
    from evaluation.suites import discover
    from mlops.errors import NotFoundError

    try:
        return discover().get(name)
    except NotFoundError as err:
        raise ConfigError(f"sweep.objective='eval/{name}/...': {err}. Fix: name a registered eval suite.") from None


def eval_metric_names(suite) -> list[str]:
    """What an eval objective can name: the suite score, an area, or a task (its primary metric)."""
    return sorted({"score"} | {t.area for t in suite.tasks} | {t.name for t in suite.tasks})


def check_eval_objective(suite: str, metric: str) -> None:
    """An eval objective names a registered suite and a score that suite reports."""
    try:
        import evaluation.runner  # noqa: F401
    except ImportError as err:
        raise ConfigError(f"sweep.objective='eval/{suite}/{metric}' needs the evaluation stage, which cannot be "
                          f"imported here ({err}). Fix: use a trainer metric such as val_loss.") from None
    names = eval_metric_names(_suite(suite))
    if metric not in names:
        raise ConfigError(f"sweep.objective='eval/{suite}/{metric}': suite '{suite}' does not report '{metric}': "
                          f"{did_you_mean(metric, names)}. Fix: name its score, an area or a task.")


def eval_scores(outcome, suite: str) -> dict[str, float]:
    """Suite score (mean of its tasks' primary metrics, as the eval run logs it), area and task scores."""
    from evaluation.results import area_scores

    tasks = [s for s in outcome.scores if s.suite == suite]
    scores = {s.name: s.value for s in tasks}
    scores.update({a.area: a.value for a in area_scores(tasks)})
    scores["score"] = sum(s.value for s in tasks) / max(1, len(tasks))
    return scores


def eval_value(objective, result, cfg, tracker, study: str) -> float:
    """Evaluate the trial's final model in deployment form (served under its profile, lm-eval through the
    endpoint) on the objective's suite; the eval run links back to the trial run (its source run)."""
    from evaluation.runner import run_eval
    from mlops.config import validate_config
    from mlops.lineage import Tag

    if not getattr(result, "model_uri", None):
        raise MLOpsError("an eval objective needs the trial's final model, and the trainer logged none. "
                         "Fix: leave train.final_model=true in the base config.")
    suite, metric = objective.suite_metric
    data = {"run": {**cfg.run.model_dump(mode="json"), "run_name": f"{cfg.run.run_name}-eval"},
            "base_model": cfg.base_model, "eval": cfg.eval.model_dump(mode="json") if cfg.eval else {}}
    outcome = run_eval(validate_config(data, source=f"the eval of {study}"), result.model_uri, suites=[suite])
    value = eval_scores(outcome, suite)[metric]
    tracker.set_tags({Tag.EVAL_RUN: outcome.run_id})
    tracker.log_metrics({f"objective/{objective.metric}": float(value)})
    return float(value)


def objective_value(objective, result, cfg, tracker) -> float:
    """The trial's value; raises with the reason when it is missing or not finite."""
    if objective.source == "eval":
        value = eval_value(objective, result, cfg, tracker, cfg.run.run_name)
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
