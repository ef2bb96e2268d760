"""The `train:` and `sweep:` config sections. `train:` is owned by training; `sweep:` by the sweep stage."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from mlops.config import HASH_EXCLUDED, StrictModel, added_option, volatile
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
    required_above_hours: float | None = volatile(
        4.0, gt=0, description="a run planned longer than this (wall hours on this machine, with the plan's margin) "
        "needs a passed smoke run of its config first (`--smoke true`); null: never required"
    )
    skip_reason: str | None = volatile(None, description="start a long run without a passed smoke; the reason is "
                                       "recorded on the run (mlops.smoke_skipped)")


class SelectSection(Section):
    """Which checkpoint becomes the final model, and when a run stops early. Every field changes what a run
    produces, so all are hashed; the section at its defaults (the last checkpoint, no early stop) is left out of
    the hash, so configs written before it keep theirs."""

    metric: str | None = Field(
        None, description="the metric that picks the final model among the run's evaluated steps: val_loss, "
        "val_perplexity, or an in-run eval score (train_eval.<suite> or train_eval.<task>, from train.eval); "
        "null: the last checkpoint"
    )
    mode: Literal["min", "max"] | None = Field(
        None, description="min or max; null: min for val_loss and val_perplexity, max for train_eval scores"
    )
    patience: int | None = Field(
        None, ge=1, description="stop after this many evaluations of the metric without an improvement larger "
        "than min_delta; null: never stop early"
    )
    min_delta: float = Field(0.0, ge=0.0, description="an improvement of this much or less does not count")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str | None) -> str | None:
        if value is None or value in ("val_loss", "val_perplexity") or value.startswith("train_eval."):
            return value
        raise ValueError(f"'{value}' is not a metric a run evaluates. Fix: use val_loss, val_perplexity, or an "
                         "in-run eval score: train_eval.<suite> (the suite's mean, e.g. train_eval.business) or "
                         "train_eval.<task> (with train.eval.suites set)")

    @model_validator(mode="after")
    def _patience_needs_metric(self) -> SelectSection:
        if self.patience is not None and self.metric is None:
            raise ValueError(f"train.select.patience={self.patience} needs a metric to be patient about. Fix: set "
                             "train.select.metric (val_loss, or an in-run eval score such as train_eval.business)")
        return self

    def resolved_mode(self) -> str:
        if self.mode is not None:
            return self.mode
        return "min" if self.metric in (None, "val_loss", "val_perplexity") else "max"


class DpoSection(Section):
    """Direct preference optimisation (train.objective=dpo) over a preference snapshot's chosen/rejected pairs."""

    beta: float = Field(0.1, gt=0, le=100.0, description="strength of the pull towards the reference model: the "
                        "implicit reward is beta x the log-probability ratio to the reference (typical 0.05-0.5)")
    loss_type: Literal["sigmoid", "ipo", "robust"] = Field(
        "sigmoid", description="sigmoid (DPO; with label_smoothing > 0 the conservative cDPO), ipo (IPO, squared "
        "loss on length-normalised log-ratios) or robust (rDPO: unbiased under label noise of rate label_smoothing)"
    )
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5, description="assumed share of pairs whose preference is "
                                   "flipped (sigmoid and robust only)")
    reference: Literal["auto", "adapters_off", "precomputed"] = Field(
        "auto", description="the reference model: adapters_off (LoRA and QLoRA: the same weights with the adapters "
        "switched off, no second copy), precomputed (its log-probabilities computed once from the starting weights "
        "before the first step and stored beside the checkpoints; the only choice for full fine-tuning); auto: "
        "adapters_off for lora and qlora, precomputed for full"
    )

    @model_validator(mode="after")
    def _smoothing_has_a_meaning(self) -> DpoSection:
        if self.loss_type == "ipo" and self.label_smoothing:
            raise ValueError(f"train.dpo.label_smoothing={self.label_smoothing} has no meaning for loss_type=ipo. "
                             "Fix: set train.dpo.label_smoothing=0, or loss_type=sigmoid (cDPO) or robust (rDPO)")
        return self


class InRunEvalSection(Section):
    """lm-eval suites on the current weights during the run, in-process (a few items per task)."""

    suites: list[str] = Field(default_factory=list, description="eval suites to run during training (e.g. "
                              "[business]); empty: none")
    every: int = Field(50, ge=1, description="run them every N optimizer steps (and at the last step)")
    limit: int | None = Field(5, ge=1, description="items per task (null: every item)")
    batch_size: int = volatile(8, ge=1, description="sequences per forward of the eval")


class SignalsSection(Section):
    """The trainer's own signals for Prometheus (deploy/prometheus/training-alerts.yml alerts on them)."""

    textfile: str | None = volatile(
        None, description="a .prom file node_exporter's textfile collector reads, rewritten at every log step "
        "(tokens/s, data-wait share, grad norm, loss, validation loss, time of the last step)"
    )
    pushgateway: str | None = volatile(None, description="a Pushgateway (host:port) the same gauges are pushed to")


class DeepSpeedSection(Section):
    backend: Literal["auto", "gloo", "nccl"] = volatile("auto", description="auto: nccl on GPU, gloo on CPU")
    launcher: Literal["torchrun", "deepspeed"] = volatile("torchrun", description="launcher for nproc > 1")
    hostfile: str | None = volatile(None, description="DeepSpeed hostfile for several nodes (deepspeed launcher)")
    master_port: int | None = volatile(None, description="rendezvous port (default: a free one)")
    extra: dict[str, Any] = Field(default_factory=dict, description="merged into the generated DeepSpeed config")


class ClusterSection(Section):
    """Where `mlops train submit` runs a job: a Ray cluster, as Ray Train workers. None of it changes what a run
    computes at a given world size, so none of it is hashed."""

    address: str | None = volatile(None, description="the Ray head's dashboard (http://HEAD:8265, the Jobs API); "
                                   "unset: RAY_ADDRESS, else a local head started under the store")
    workers: int = volatile(2, ge=1, le=4096, description="Ray Train workers: one per GPU, or CPU processes")
    use_gpu: bool = volatile(False, description="one GPU per worker (NCCL); false: CPU workers (gloo)")
    cpus_per_worker: float = volatile(1.0, gt=0, le=256, description="CPUs each worker reserves")
    hardware: str = volatile("cpu", description="the planner's name of the devices (cpu, l4, a10g, rtx4090, a100-40gb, "
                             "a100-80gb, l40s, a6000, h100-80gb, h100-94gb, "
                             "h200): admission plans the job's hours and memory on it")
    max_failures: int = volatile(3, ge=0, le=100, description="times the worker group restarts after a lost worker "
                                 "or node (each resumes from the last full-state checkpoint)")
    placement: Literal["SPREAD", "PACK"] = volatile("SPREAD", description="spread workers over nodes, or pack them")
    storage_path: str | None = volatile(None, description="shared storage for the job's checkpoints and Ray "
                                        "Train's run folder (default: the team's prefix under the checkpoints root)")
    poll_seconds: float = volatile(2.0, gt=0, le=60, description="how often a queued job looks for its turn")


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
        "lora", description="LoRA adapters, full fine-tuning, or QLoRA (LoRA over a 4-bit NF4 base, bitsandbytes); "
        "`dpo` is shorthand for train.objective=dpo with LoRA"
    )
    objective: Literal["sft", "dpo"] = added_option(
        "sft", description="sft (next-token loss on a chat snapshot's answers) or dpo (preference pairs of a "
        "preference snapshot, against a reference model: train.dpo)"
    )
    dpo: DpoSection = added_option(default_factory=DpoSection, description="the DPO objective's settings")
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
    select: SelectSection = added_option(default_factory=SelectSection,
                                         description="best-checkpoint selection and early stopping")
    eval: InRunEvalSection = added_option(default_factory=InRunEvalSection,
                                          description="eval suites on the current weights during the run")
    signals: SignalsSection = Field(default_factory=SignalsSection, json_schema_extra={HASH_EXCLUDED: True},
                                    description="Prometheus textfile or Pushgateway for the trainer's signals")
    smoke: SmokeSection = Field(default_factory=SmokeSection)
    deepspeed: DeepSpeedSection = Field(default_factory=DeepSpeedSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection, json_schema_extra={HASH_EXCLUDED: True},
                                    description="where `mlops train submit` runs a job (a Ray cluster); never hashed")
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
    system_metrics_seconds: float | None = volatile(
        10.0, ge=1, description="MLflow's system metrics (CPU, memory, GPU through NVML) on the run at this interval; "
        "null: off"
    )
    debug: DebugSection = Field(default_factory=DebugSection)

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError("each beta must be in [0, 1) (at 1 or above AdamW's bias correction divides by zero "
                             "or flips sign); typical values are 0.9 and 0.999")
        return value

    @model_validator(mode="before")
    @classmethod
    def _dpo_shorthand(cls, data: Any) -> Any:
        # `train.mode=dpo` is how teams moving from SFT ask for it; the adapters stay LoRA unless they say otherwise
        if isinstance(data, dict) and data.get("mode") == "dpo":
            if data.get("objective", "dpo") != "dpo":
                raise ValueError(f"train.mode=dpo contradicts train.objective={data['objective']}. Fix: drop one of "
                                 "them (train.mode=dpo means train.objective=dpo with LoRA)")
            data = {**data, "mode": "lora", "objective": "dpo"}
        return data

    @model_validator(mode="after")
    def _dpo_has_a_reference(self) -> TrainConfig:
        if self.objective == "dpo" and self.mode == "full" and self.dpo.reference == "adapters_off":
            raise ValueError("train.dpo.reference=adapters_off needs adapters to switch off, and train.mode=full has "
                             "none: no reference is possible. Fix: set train.dpo.reference=precomputed (or auto), or "
                             "train.mode=lora")
        return self

    def dpo_reference(self) -> str | None:
        """How a DPO run gets its reference log-probabilities (None: not a DPO run)."""
        if self.objective != "dpo":
            return None
        if self.dpo.reference != "auto":
            return self.dpo.reference
        return "adapters_off" if self.mode in ADAPTER_MODES else "precomputed"

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

