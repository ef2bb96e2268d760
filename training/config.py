"""The `train:` and `sweep:` config sections. Owned by training."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mlops.config import StrictModel, volatile


class LoraSection(StrictModel):
    r: int = Field(8, ge=1, description="LoRA rank")
    alpha: int = Field(16, ge=1, description="LoRA alpha")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="LoRA dropout")
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class TrainConfig(StrictModel):
    snapshot: str | None = Field(None, description="data snapshot id to train on (see `mlops data list`)")
    mode: Literal["lora", "full"] = Field("lora", description="LoRA adapters or full fine-tuning")
    lora: LoraSection = Field(default_factory=LoraSection)
    zero_stage: Literal[0, 1, 2] = Field(0, description="DeepSpeed ZeRO stage")
    lr: float = Field(2e-4, gt=0, description="peak learning rate")
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(10, ge=0)
    max_steps: int = Field(100, ge=1)
    micro_batch_size: int = Field(4, ge=1, description="sequences per process per micro step")
    grad_accum: int = Field(1, ge=1, description="micro steps per optimizer step")
    grad_clip: float = Field(1.0, ge=0)
    checkpoint_every: int = volatile(50, ge=1, description="save a checkpoint every N steps")
    eval_every: int = volatile(50, ge=1, description="validation loss every N steps")


class SweepConfig(StrictModel):
    study: str = Field("sweep", description="Optuna study name")
    space: str = Field("lora", description="registered search space name")
    n_trials: int = volatile(8, ge=1)
    pruner: Literal["median", "hyperband", "none"] = "median"
    objective: str = Field("val_loss", description="metric to optimise")
    direction: Literal["minimize", "maximize"] = "minimize"
    storage: str | None = volatile(None, description="Optuna storage URL (default: SQLite under .mlops)")
