"""The `sweep:` config section. `mlops.config` assembles it into the root through `training.config`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from mlops.config import HASH_EXCLUDED, StrictModel, volatile


class ParamSpec(StrictModel):
    """One searched parameter, mapped to a dotted config key and applied as an override of the base config."""

    key: str | None = Field(None, description="dotted config key it sets, e.g. train.lr (default: train.<name>)")
    type: Literal["float", "int", "categorical"] = Field("float", description="float, int or categorical")
    low: float | None = Field(None, description="lower bound (float and int)")
    high: float | None = Field(None, description="upper bound, inclusive (float and int)")
    log: bool = Field(False, description="sample on a log scale (bounds must be > 0)")
    step: float | None = Field(None, description="discretisation step (not with log)")
    choices: list[Any] | None = Field(None, description="the values of a categorical parameter")
    of: str | None = Field(
        None, description="the value is a fraction of this numeric config key, e.g. warmup ratio of train.max_steps"
    )
    enabled: bool = Field(True, description="false drops a parameter of the registered space")


class PrunerSection(StrictModel):
    name: str = Field("median", description="registered pruner: median, hyperband (ASHA brackets), asha or none")
    n_startup_trials: int = Field(2, ge=0, description="median: trials that finish before any pruning")
    n_warmup_steps: int = Field(0, ge=0, description="median: trainer steps before a trial can be pruned")
    interval_steps: int = Field(1, ge=1, description="median: prune checks every N reported steps")
    min_resource: int | None = Field(None, ge=1, description="hyperband/asha: first rung in steps (default train.eval_every)")
    max_resource: int | None = Field(None, ge=1, description="hyperband: full budget in steps (default train.max_steps)")
    reduction_factor: int = Field(3, ge=2, description="hyperband/asha: keep 1/N of the trials at each rung")


class SweepConfig(StrictModel):
    study: str = Field("sweep", description="Optuna study name (workers join it by this name)")
    base_config: str | None = Field(
        None, description="train config file every trial starts from (default: this file without `sweep:`)"
    )
    base_overrides: list[str] = Field(default_factory=list, description="key=value overrides of the base config")
    space: str = Field("lora", description="registered search space name (see `mlops sweep spaces`)")
    params: dict[str, ParamSpec] = Field(
        default_factory=dict, description="parameters that add to or override the registered space, by name"
    )
    enqueue: list[dict[str, Any]] = Field(
        default_factory=list, json_schema_extra={HASH_EXCLUDED: True},
        description="trials to run first with fixed params (e.g. today's production settings)",
    )
    objective: str = Field("val_loss", description="trainer metric, or eval/<suite>/<metric> (deployment-form eval)")
    direction: Literal["minimize", "maximize"] = "minimize"
    pruner: PrunerSection = Field(default_factory=PrunerSection)
    sampler: str = Field("tpe", description="registered sampler: tpe or random")
    n_trials: int = volatile(8, ge=1, description="trials this command adds to the study")
    storage: str | None = volatile(None, description="Optuna storage URL (default: SQLite under .mlops)")
    heartbeat_interval: int = volatile(10, ge=1, description="seconds between a running trial's heartbeats")
    grace_period: int | None = volatile(
        None, ge=1, description="seconds without heartbeat before a trial is failed (default 3 x interval)"
    )
    retry_failed: int = volatile(0, ge=0, description="requeue a trial whose worker died, up to N times")
    keep_checkpoints: bool = volatile(False, description="keep each finished trial's checkpoints")
    register_best: bool = volatile(False, description="register the best trial's model as a candidate at the end")
    register_name: str | None = volatile(None, description="registered model name for --register (default: study)")

    @field_validator("pruner", mode="before")
    @classmethod
    def _pruner_shorthand(cls, value: Any) -> Any:
        # `pruner: hyperband` and `sweep.pruner=hyperband` mean the pruner of that name with its defaults.
        return {"name": value} if isinstance(value, str) else value
