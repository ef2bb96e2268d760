"""The `eval:` config section. Owned by evaluation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mlops.config import StrictModel, volatile


class GateConfig(StrictModel):
    mode: Literal["noise_tolerant", "strict"] = Field(
        "noise_tolerant",
        description="noise_tolerant: fail only when the interval shows a drop beyond the margin; "
        "strict: pass only when the interval shows non-inferiority",
    )
    z: float = Field(1.645, gt=0, description="interval half-width in stderrs of the delta (1.645: one-sided 95%)")
    general_margin: float = Field(0.02, ge=0, description="non-inferiority margin for general tasks")
    business_margin: float = Field(0.0, ge=0, description="allowed drop for business dimensions (0: none)")
    must_improve: list[str] = Field(default_factory=list, description="business dimensions that must improve")
    floors: dict[str, float] = Field(
        default_factory=dict, description="absolute floors by task, dimension or suite name, used without a champion"
    )
    default_floor: float | None = Field(None, ge=0, le=1, description="floor for every task without its own")
    must_beat: dict[str, float] = Field(
        default_factory=dict,
        description="scores to beat beyond the interval, with or without a champion (e.g. the untuned base "
        "model's): a suite name means its n-weighted aggregate; a task or dimension name, that score",
    )
    history: list[str] = Field(default_factory=list, description="past champion model refs also compared against")
    history_from_registry: int = Field(
        0, ge=0, description="also compare against this many earlier versions that passed the gate"
    )
    quantization_max_drop: float = Field(
        0.10, ge=0, le=1, description="a quantized release form may score at most this much below the same version "
        "on hf as trained, on any task (judged on the interval, as `mode` says)"
    )
    quantization_max_suite_drop: float = Field(
        0.03, ge=0, le=1, description="the same, on each dimension suite's n-weighted aggregate (business)"
    )


class ContaminationConfig(StrictModel):
    """The report uses the contamination rule the snapshot was built with (its manifest's `data.decontam`):
    one definition for build and report, so it has no n-gram setting of its own."""

    enabled: bool = Field(True, description="check eval items against the training snapshot, first in each eval")
    split: str = Field("train", description="snapshot split the model was trained on")
    when_found: Literal["stop", "score"] = Field(
        "stop", description="an eval item overlaps the training snapshot: stop (the report only, nothing served: "
        "the contamination gate refuses the model whatever it scores) or score it anyway (a diagnosis)")


class EvalConfig(StrictModel):
    suites: list[str] = Field(default_factory=lambda: ["general", "business"], description="registered eval suites")
    suite_paths: list[str] = Field(default_factory=list, description="extra folders holding suite folders")
    limit: int | None = Field(None, ge=1, description="items per task (None: all)")
    chat_template_mc: bool = Field(
        True, description="render multiple-choice prompts through the chat template and system prompt"
    )
    batch_size: int = Field(8, ge=1, description="loglikelihood prompts per request")
    concurrency: int = Field(8, ge=1, description="requests in flight against the server")
    bootstrap_iters: int = Field(1000, ge=0, description="lm-eval bootstrap iterations for non-mean metrics")
    use_cache: bool = volatile(True, description="reuse responses cached per model version and profile")
    server_start_timeout: float = volatile(300.0, gt=0, description="seconds to wait for the server's /health")
    server_threads: int | None = volatile(None, ge=1, description="compute threads of the eval's server (default: "
                                          "every core; during an eval it is the only busy process, lm-eval waits "
                                          "on it). Set 1 on a box shared with other jobs")
    request_timeout: int = volatile(600, ge=1, description="seconds per request before lm-eval retries")
    gate: GateConfig = Field(default_factory=GateConfig)
    contamination: ContaminationConfig = Field(default_factory=ContaminationConfig)
