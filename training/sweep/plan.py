"""Everything a sweep decides before its first trial, validated at once, and stored with the study.

A plan is built from the sweep config file (`build_plan`) by `sweep run`, saved as a study user attribute,
and rebuilt from there by every worker (`SweepPlan.from_attrs`), so workers on other machines need only the
storage URL and the study name: never the config files.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlops.errors import ConfigError, did_you_mean
from training.sweep.config import ParamSpec, SweepConfig
from training.sweep.pruners import Budget, check_names, make_pruner
from training.sweep.spaces import resolve_space, validate_enqueued, validate_space

PLAN_ATTR = "mlops.plan"
PLAN_VERSION = 1
# What the trainer returns in TrainResult.metrics, and what it passes to `report` after each validation.
TRAINER_METRICS = ("val_loss", "val_perplexity", "loss", "loss_first", "loss_last", "train_tokens_per_s",
                   "tokens_seen", "steps")
REPORTED_METRICS = ("val_loss", "val_perplexity", "loss")
EVAL_PREFIX = "eval/"


@dataclass(frozen=True)
class Objective:
    metric: str  # a trainer metric, or eval/<suite>/<metric>
    direction: str
    intermediate: str  # what `report` feeds the pruner
    sign: float  # the intermediate value is multiplied by this so it moves with the objective's direction

    @property
    def source(self) -> str:
        return "eval" if self.metric.startswith(EVAL_PREFIX) else "trainer"

    @property
    def suite_metric(self) -> tuple[str, str]:
        _, suite, metric = self.metric.split("/", 2)
        return suite, metric


def parse_objective(metric: str, direction: str) -> Objective:
    """Fails, naming the metric and the fix, when the trainer (or an eval suite) cannot produce it."""
    if metric.startswith(EVAL_PREFIX):
        parts = metric.split("/")
        if len(parts) != 3 or not all(parts[1:]):
            raise ConfigError(f"sweep.objective='{metric}' is not of the form eval/<suite>/<metric>. "
                              "Fix: write it like eval/general/accuracy, or use a trainer metric such as val_loss.")
        from training.sweep.objective import check_eval_objective

        check_eval_objective(parts[1], parts[2])
        # Eval runs once per trial, at the end; the pruner watches the validation loss meanwhile.
        return Objective(metric, direction, "val_loss", 1.0 if direction == "minimize" else -1.0)
    if metric not in TRAINER_METRICS:
        raise ConfigError(
            f"sweep.objective='{metric}' is not a metric the trainer produces: {did_you_mean(metric, TRAINER_METRICS)}. "
            "Fix: pick one of those, or eval/<suite>/<metric> for a deployment-form eval metric."
        )
    intermediate = metric if metric in REPORTED_METRICS else "val_loss"
    sign = 1.0 if (intermediate == metric or direction == "minimize") else -1.0
    return Objective(metric, direction, intermediate, sign)


@dataclass
class SweepPlan:
    study: str
    sweep: SweepConfig
    base: dict[str, Any]  # the base config data every trial copies (base overrides applied)
    params: dict[str, ParamSpec]
    objective: Objective
    budget: Budget
    seed: int
    experiment: str

    @property
    def plan_hash(self) -> str:
        """What makes two sweeps the same study: space, objective, pruner, sampler and base config."""
        from mlops.config import canonical_json, config_hash, validate_config

        blob = {
            "sweep": json.loads(canonical_json(self.sweep.model_copy(update={"study": "", "base_config": None,
                                                                              "base_overrides": []}))),
            "params": {k: v.model_dump(mode="json") for k, v in sorted(self.params.items())},
            "base": config_hash(validate_config(copy.deepcopy(self.base))),
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()

    @property
    def base_hash(self) -> str:
        from mlops.config import config_hash, validate_config

        return config_hash(validate_config(copy.deepcopy(self.base)))

    def pruner(self):
        return make_pruner(self.sweep.pruner, self.budget)

    def to_attrs(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "study": self.study, "sweep": self.sweep.model_dump(mode="json", exclude_unset=True),
                "base": self.base, "seed": self.seed, "experiment": self.experiment, "plan_hash": self.plan_hash}

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> SweepPlan:
        if attrs.get("version") != PLAN_VERSION:
            raise ConfigError(f"this study was written by plan version {attrs.get('version')}, this code reads "
                              f"{PLAN_VERSION}. Fix: run the worker from the same code version as `sweep run`.")
        sweep = SweepConfig.model_validate(attrs["sweep"])
        return _assemble(attrs["study"], sweep, attrs["base"], attrs["seed"], attrs["experiment"])


def _assemble(study: str, sweep: SweepConfig, base: dict, seed: int, experiment: str) -> SweepPlan:
    from mlops.config import require_section, validate_config

    base_cfg = validate_config(copy.deepcopy(base), source="the base train config")
    train = require_section(base_cfg, "train")
    params = resolve_space(sweep.space, sweep.params)
    validate_space(params, base)
    validate_enqueued(params, sweep.enqueue)
    check_names(sweep.pruner.name, sweep.sampler)
    objective = parse_objective(sweep.objective, sweep.direction)
    plan = SweepPlan(study, sweep, base, params, objective, Budget(train.eval_every, train.max_steps), seed,
                     experiment)
    plan.pruner()  # bounds such as min_resource > max_steps fail here, before any trial
    return plan


def partition_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """`sweep.*` overrides configure the sweep; every other one changes the base config of all trials
    (`run.*` ones go to both, so the parent run and the trials agree)."""
    sweep = [o for o in overrides if o.strip().startswith(("sweep.", "run."))]
    base = [o for o in overrides if not o.strip().startswith("sweep.")]
    return sweep, base


def _base_path(value: str, sweep_file: Path | None) -> Path:
    from mlops.config import find_config_file

    # Also relative to the sweep file's folder or one above it (a sweep file in configs/sweep/ names
    # configs/train/x.yaml as the repository root sees it).
    found = find_config_file(Path(value), list(sweep_file.resolve().parents) if sweep_file else [])
    if found.is_file():
        return found
    raise ConfigError(f"sweep.base_config='{value}' does not exist (looked in the working folder, the project folder "
                      "and above the sweep file). Fix: name a train config file relative to the project folder, "
                      "e.g. configs/train/tiny.yaml.")


def build_plan(config: Path | str | None, overrides: list[str] = (), *, study: str | None = None,
               n_trials: int | None = None, storage: str | None = None) -> SweepPlan:
    """Load the sweep config and its base train config, and validate every part of the sweep."""
    from mlops.config import apply_overrides, read_yaml, require_section, validate_config

    sweep_file = Path(config) if config else None
    raw = read_yaml(sweep_file) if sweep_file else {}
    sweep_over, base_over = partition_overrides(list(overrides))
    extra = [f"sweep.study={study}"] * bool(study) + [f"sweep.n_trials={n_trials}"] * (n_trials is not None)
    extra += [f"sweep.storage={storage}"] * bool(storage)
    root = validate_config(apply_overrides(copy.deepcopy(raw), [*sweep_over, *extra]),
                           source=str(sweep_file or "overrides"))
    sweep = require_section(root, "sweep")
    if sweep.base_config:
        base = read_yaml(_base_path(sweep.base_config, sweep_file))
    else:
        base = {k: v for k, v in raw.items() if k != "sweep"}
    base.pop("sweep", None)
    base = apply_overrides(base, [*sweep.base_overrides, *base_over])
    base = json.loads(json.dumps(base, default=str))  # plain JSON data: it is stored with the study
    return _assemble(sweep.study, sweep, base, root.run.seed, root.run.experiment)
