"""Pruners and samplers, registered by name. Resources are trainer steps: the trainer reports validation
metrics every `train.eval_every` steps, so that is the natural first rung, and `train.max_steps` the full budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlops.errors import ConfigError, NotFoundError
from mlops.plugins import Registry
from training.sweep.config import PrunerSection


@dataclass(frozen=True)
class Budget:
    """What a trial of this sweep reports: every `eval_every` steps, up to `max_steps`."""

    eval_every: int
    max_steps: int


PRUNERS: Registry[Callable[[PrunerSection, Budget], Any]] = Registry("pruner")
SAMPLERS: Registry[Callable[[int | None], Any]] = Registry("sampler")


@PRUNERS.register("median")
def _median(p: PrunerSection, budget: Budget):
    import optuna

    return optuna.pruners.MedianPruner(
        n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps, interval_steps=p.interval_steps
    )


def _rungs(p: PrunerSection, budget: Budget) -> tuple[int, int]:
    low = p.min_resource or budget.eval_every
    high = p.max_resource or budget.max_steps
    if low > high:
        raise ConfigError(
            f"sweep.pruner.min_resource={low} is above the full budget max_resource={high} (train.max_steps "
            f"{budget.max_steps}). Fix: lower sweep.pruner.min_resource or raise train.max_steps."
        )
    return low, high


@PRUNERS.register("hyperband")
def _hyperband(p: PrunerSection, budget: Budget):
    """Hyperband: several brackets of asynchronous successive halving (ASHA)."""
    import optuna

    low, high = _rungs(p, budget)
    return optuna.pruners.HyperbandPruner(min_resource=low, max_resource=high, reduction_factor=p.reduction_factor)


@PRUNERS.register("asha")
def _asha(p: PrunerSection, budget: Budget):
    """One bracket of asynchronous successive halving."""
    import optuna

    low, _ = _rungs(p, budget)
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=low, reduction_factor=p.reduction_factor)


@PRUNERS.register("none")
def _none(p: PrunerSection, budget: Budget):
    import optuna

    return optuna.pruners.NopPruner()


@SAMPLERS.register("tpe")
def _tpe(seed: int | None):
    import optuna

    # constant_liar: concurrent workers treat each other's running trials as bad, so they spread out.
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=4)


@SAMPLERS.register("random")
def _random(seed: int | None):
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


def _get(registry: Registry, name: str, field: str):
    try:
        return registry.get(name)
    except NotFoundError as err:
        raise ConfigError(f"{field}='{name}': {err}. Fix: set {field} to one of those names.") from None


def check_names(pruner: str, sampler: str) -> None:
    _get(PRUNERS, pruner, "sweep.pruner.name")
    _get(SAMPLERS, sampler, "sweep.sampler")


def make_pruner(p: PrunerSection, budget: Budget):
    return _get(PRUNERS, p.name, "sweep.pruner.name")(p, budget)


def make_sampler(name: str, seed: int | None):
    return _get(SAMPLERS, name, "sweep.sampler")(seed)
