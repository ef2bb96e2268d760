"""The `train:` and `sweep:` config sections. `train:` is owned by training; `sweep:` by the sweep stage."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from mlops.config import StrictModel, added_option, volatile
from mlops.errors import ConfigError

ADAPTER_MODES = ("lora", "qlora")  # modes that train LoRA adapters over a frozen base (checkpoints hold the adapters)
RESUME_NONE = ("never", "none")  # both spellings start over; `none` is what operators tend to type


class Section(StrictModel):
    """Training sections refuse inf and nan anywhere: a non-finite setting can only produce non-finite weights."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraSection(Section):
    r: int = Field(8, ge=1, description="LoRA rank")
    alpha: int = Field(16, ge=1, description="LoRA alpha")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="LoRA dropout")
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class CheckpointSection(Section):
    dir: str | None = volatile(None, description="checkpoint folder (default .mlops/checkpoints/<config hash>)")
    every_seconds: float | None = volatile(None, gt=0, description="also save when this much wall time passed")
    keep_last: int = volatile(2, ge=1, description="keep the newest K complete checkpoints")
    keep_every: int | None = volatile(None, ge=1, description="also keep every checkpoint whose step is a multiple")
    resume: str = volatile(
        "auto", description="auto (newest verified checkpoint), never (or none: start over), or a checkpoint folder"
    )
    universal: bool = volatile(
        False, description="allow resuming at another world size through DeepSpeed's universal checkpoint"
    )
    replan_batch: bool = volatile(
        False, description="allow a resume to change the global batch (the data position must fall on a step of it)"
    )
    grace_seconds: float = volatile(
        30.0, ge=0, description="after SIGTERM/SIGINT: finish the step, then save if a save fits in this many seconds"
    )

    @field_validator("resume")
    @classmethod
    def _resume_value(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be auto, never, none or a checkpoint folder (step-XXXXXXXX), not empty")
        return value.strip()


class GuardSection(Section):
    # On by default, and loose: a real divergence moves the grad norm by orders of magnitude, while healthy runs
    # stay within a few times their median. A null factor turns the rule off.
    spike_factor: float | None = Field(
        50.0, gt=1.0, description="stop when the grad norm exceeds this many times its running median (null: off)"
    )
    spike_window: int = Field(50, ge=3, description="steps in the running median of the grad norm")
    spike_warmup: int = Field(10, ge=0, description="steps before the spike rule applies")
    finite_weights: bool = Field(
        True, description="after every optimizer step check that the weights are finite (one pass over them)"
    )


class SmokeSection(Section):
    steps: int = Field(30, ge=4, description="optimizer steps of a smoke run")
    min_loss_drop: float = Field(0.0, ge=0.0, lt=1.0, description="required relative drop of the loss")
    min_tokens_per_s: float = volatile(0.0, ge=0.0, description="throughput floor of a smoke run")


class DeepSpeedSection(Section):
    backend: Literal["auto", "gloo", "nccl"] = volatile("auto", description="auto: nccl on GPU, gloo on CPU")
    launcher: Literal["torchrun", "deepspeed"] = volatile("torchrun", description="launcher for nproc > 1")
    hostfile: str | None = volatile(None, description="DeepSpeed hostfile for several nodes (deepspeed launcher)")
    master_port: int | None = volatile(None, description="rendezvous port (default: a free one)")
    extra: dict[str, Any] = Field(default_factory=dict, description="merged into the generated DeepSpeed config")


class DebugSection(Section):
    """Fault injection for tests and drills. Each one changes what a run does, so each is hashed."""

    nan_at_step: int | None = Field(None, ge=1, description="make the loss NaN at this step")
    spike_at_step: int | None = Field(None, ge=1, description="multiply the loss by 1e4 at this step")
    crash_after_step: int | None = Field(None, ge=1, description="exit hard after this step (like a kill)")
    kill_in_save_step: int | None = Field(None, ge=1, description="SIGKILL itself while saving this step")
    sigterm_at_step: int | None = Field(None, ge=1, description="rank 0 sends itself SIGTERM during this step")
    inf_lr_at_step: int | None = Field(
        None, ge=1, description="apply this step with lr=inf: non-finite weights from finite loss and grads"
    )


class TrainConfig(Section):
    snapshot: str | None = Field(None, description="data snapshot id (or `latest`) to train on")
    mode: Literal["lora", "full", "qlora"] = Field(
        "lora", description="LoRA adapters, full fine-tuning, or QLoRA (LoRA over a 4-bit NF4 base, bitsandbytes)"
    )
    lora: LoraSection = Field(default_factory=LoraSection)
    zero_stage: Literal[0, 1, 2, 3] = Field(
        0, description="DeepSpeed ZeRO stage: 1 partitions the optimizer state, 2 the gradients too, 3 the weights too"
    )
    # Null means auto, and keeps the config hash of configs written before the field existed.
    precision: Literal["fp32", "bf16", "fp16"] | None = Field(
        None, description="DeepSpeed mixed precision (fp32 master weights and optimizer state); null: bf16 on a GPU "
        "that supports it, fp32 on CPU. fp16 uses dynamic loss scaling and needs a GPU"
    )
    # Recomputation under the saved RNG state gives the same values: a memory lever, not a result-changing one.
    activation_checkpointing: bool = volatile(
        False, description="recompute each layer's activations in backward (HF gradient checkpointing, non-reentrant)"
    )
    offload: Literal["none", "optimizer", "optimizer_and_params"] = added_option(
        "none", description="ZeRO-Offload to host memory: the optimizer state (ZeRO >= 1), or it and the weights "
        "(ZeRO-3 only)"
    )
    allow_unfit: bool = volatile(
        False, description="run even when the plan says the job does not fit this machine (recorded on the run)"
    )
    lr: float = Field(2e-4, gt=0, le=1.0, description="peak learning rate (AdamW moves each weight by about lr a step)")
    lr_schedule: Literal["cosine", "linear", "constant"] = Field("cosine", description="decay after warmup")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="final lr as a fraction of the peak")
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW moment decay rates, each in [0, 1)")
    adam_eps: float = Field(1e-8, gt=0)
    warmup_steps: int = Field(10, ge=0)
    max_steps: int = Field(100, ge=1)
    micro_batch_size: int = Field(4, ge=1, description="sequences per process per micro step")
    grad_accum: int = Field(1, ge=1, description="micro steps per optimizer step")
    global_batch_size: int | None = Field(
        None, ge=1, description="sequences per optimizer step; when set, grad_accum follows from the world size"
    )
    grad_clip: float = Field(1.0, ge=0, description="clip the global grad norm (0 = off)")
    max_seq_len: int | None = Field(None, ge=8, description="cut every sample to this many tokens (default: none)")
    checkpoint_every: int = volatile(50, ge=1, description="save a checkpoint every N steps")
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    eval_every: int = volatile(50, ge=1, description="validation loss every N steps")
    eval_samples: int | None = Field(None, ge=1, description="validation samples per evaluation (default all)")
    guards: GuardSection = Field(default_factory=GuardSection)
    smoke: SmokeSection = Field(default_factory=SmokeSection)
    deepspeed: DeepSpeedSection = Field(default_factory=DeepSpeedSection)
    max_context: int | None = Field(None, ge=16, description="served context (default: the base model's)")
    serve_engine: str = Field("hf", description="the engine the version's deployment profile names: hf, llamacpp "
                              "(CPU, GGUF) or vllm (GPU); evals and servers of the version run on it")
    serve_quantization: str | None = Field(None, description="the GGUF type the profile names on llamacpp (f16, "
                                           "q8_0, q4_k_m); none serves the weights as trained")

    @field_validator("serve_quantization")
    @classmethod
    def _known_quantization(cls, value: str | None) -> str | None:
        from mlops.profile import known_quantization

        return known_quantization(value)

    @field_validator("serve_engine")
    @classmethod
    def _known_engine(cls, name: str) -> str:
        from serving.engine import known_engine  # the engines register by name there

        return known_engine(name)
    final_model: bool = volatile(True, description="consolidate, merge and log the final model")
    peak_flops: float | None = volatile(None, gt=0, description="peak FLOP/s for MFU (default: measured)")
    progress: bool = volatile(True, description="show a progress bar on rank 0")
    heartbeat_seconds: float = volatile(
        30.0, ge=1, description="rank 0 stamps the run's heartbeat tag this often (the reaper's sign of life)"
    )
    debug: DebugSection = Field(default_factory=DebugSection)

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError("each beta must be in [0, 1) (at 1 or above AdamW's bias correction divides by zero "
                             "or flips sign); typical values are 0.9 and 0.999")
        return value

    @model_validator(mode="after")
    def _levers_compose(self) -> TrainConfig:
        if self.offload == "optimizer_and_params" and self.zero_stage != 3:
            raise ValueError(
                f"train.offload=optimizer_and_params needs train.zero_stage=3 (weights are only partitioned, and so "
                f"offloadable, at ZeRO-3), not {self.zero_stage}. Fix: set train.zero_stage=3, or "
                "train.offload=optimizer."
            )
        if self.offload == "optimizer" and self.zero_stage == 0:
            raise ValueError(
                "train.offload=optimizer needs train.zero_stage >= 1 (ZeRO-Offload moves the partitioned optimizer "
                "state), not 0. Fix: set train.zero_stage=2 (or 1 or 3), or train.offload=none."
            )
        return self

    def batch_layout(self, world_size: int) -> tuple[int, int, int]:
        """(micro_batch_size, grad_accum, global_batch) at a world size; ConfigError when they don't divide."""
        micro = self.micro_batch_size
        if self.global_batch_size is None:
            return micro, self.grad_accum, micro * self.grad_accum * world_size
        per_step = micro * world_size
        if self.global_batch_size % per_step:
            raise ConfigError(
                f"train.global_batch_size={self.global_batch_size} is not divisible by "
                f"train.micro_batch_size ({micro}) x world size ({world_size}) = {per_step}. "
                f"Fix: set train.global_batch_size to a multiple of {per_step}, or change "
                "train.micro_batch_size or the number of processes."
            )
        return micro, self.global_batch_size // per_step, self.global_batch_size

