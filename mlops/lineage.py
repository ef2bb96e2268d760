"""The lineage vocabulary, defined once, and how each value is found.

This module is the only place lineage tag names are spelled. Runs, checkpoints, snapshots and model versions
all carry the same tags, so any artifact can be traced back to its config, data, code and runtime image.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from mlops.errors import StrictModeError

# 2: dedup clusters are transitive (connected components of the band-sharded LSH, kept by smallest source/line)
# and quarantine is in (source, line) order, so a build key of pipeline 1 must not return its old snapshot.
PIPELINE_VERSION = "3"
IMAGE_TAG_ENV = "MLOPS_IMAGE_TAG"


class Tag(StrEnum):
    """Lineage tag names, as they appear on MLflow runs and model versions."""

    CONFIG_HASH = "mlops.config_hash"
    SNAPSHOT_ID = "mlops.data_snapshot_id"
    IMAGE_TAG = "mlops.image_tag"
    IMAGE_TAG_MUTABLE = "mlops.image_tag_mutable"
    GIT_COMMIT = "mlops.git_commit"
    GIT_DIRTY = "mlops.git_dirty"
    BASE_MODEL = "mlops.base_model"
    BASE_MODEL_ID = "mlops.base_model_id"
    SEED = "mlops.seed"
    CHECKPOINT_MANIFEST = "mlops.checkpoint_manifest_uri"
    CODE_VERSION = "mlops.code_version"
    STAGE = "mlops.stage"
    WORLD_SIZE = "mlops.world_size"
    ZERO_STAGE = "mlops.zero_stage"
    PRECISION = "mlops.precision"  # the precision a training ran in (train.precision resolved for its device)
    PLAN_VERDICT = "mlops.plan_verdict"  # "fits", or why it ran although the plan said it does not fit
    RELEASE = "mlops.release"
    FAILURE_REASON = "mlops.failure_reason"
    PARENT_RUN = "mlops.parent_run_id"
    SOURCE_RUN = "mlops.source_run_id"
    SUITE_VERSION = "mlops.suite_version"
    PROFILE_HASH = "mlops.deployment_profile_hash"
    TRAIN_MODE = "mlops.train_mode"
    TRAIN_OBJECTIVE = "mlops.train_objective"  # sft or dpo (a DPO run trains on a preference snapshot)
    STOP_REASON = "mlops.stop_reason"
    RESUMED_FROM = "mlops.resumed_from_checkpoint"
    SMOKE = "mlops.smoke"
    PROFILE = "mlops.deployment_profile"
    MODEL_KEY = "mlops.model_key"  # on eval and gate runs: the content id of the model they judged
    MODEL_ID = "mlops.model_content_id"  # weights + tokenizer + chat template, written once when training ends
    DATA_RUN = "mlops.data_run_id"  # the data run that built the snapshot (its manifest and GE results)
    EVAL_LIMIT = "mlops.eval_limit"  # items per task an eval ran with ("all" for the full suites)
    HOST = "mlops.host"
    PID = "mlops.pid"
    PROCESS_START = "mlops.process_start"  # the process's start time: a reused pid is not the same process
    HEARTBEAT = "mlops.heartbeat"  # UTC epoch seconds of the last sign of life of a long run
    REAPED = "mlops.reaped"  # why a RUNNING run whose process was gone was marked KILLED
    ACTOR = "mlops.actor"  # the registry identity that ran the stage (MLOPS_USER), not the OS user
    ACTOR_VERIFIED = "mlops.actor_verified"  # true when MLOPS_PASSWORD authenticated it
    MODEL_REF = "mlops.model_ref"
    EVAL_RUN = "mlops.eval_run_id"
    EVAL_FORCED_PROFILE = "mlops.eval_forced_profile"
    EVAL_ENGINE = "mlops.eval_engine"  # the engine and weights an eval judged: "llamacpp q8_0", "hf (as trained)"
    EVAL_REFERENCE = "mlops.eval_reference"  # true: the version's reference form (hf, as trained), not its release form
    EVAL_NOT_SCORED = "mlops.eval_not_scored"  # why an eval served nothing ("contaminated": the report alone)
    EVAL_REFERENCE_RUN = "mlops.eval_reference_run_id"  # on a version: its reference eval (the quantization gate's)
    GGUF_RUN = "mlops.gguf_run_id"  # on a version: the package run that logged its GGUF (`mlops release package`)
    GGUF_SHA256 = "mlops.gguf_sha256"
    GGUF_QUANTIZATION = "mlops.gguf_quantization"
    LLAMACPP_VERSION = "mlops.llamacpp_version"  # the llama.cpp build (llama-cpp-python release) that made it
    CAPACITY_RUN = "mlops.capacity_run_id"  # on a version: its capacity run (`mlops release capacity`)
    GATE_EVAL = "gate.eval"
    GATE_REASONS = "gate.eval.reasons"
    GATE_RUN = "gate.eval.run_id"
    CONTAMINATION_STATUS = "contamination.status"
    CONTAMINATION_COUNT = "contamination.count"
    CONTAMINATION_ITEMS = "contamination.items"
    SWEEP_STUDY = "mlops.sweep.study"
    SWEEP_TRIAL = "mlops.sweep.trial_number"
    SWEEP_TRIAL_STATE = "mlops.sweep.trial_state"
    SWEEP_BEST_TRIAL = "mlops.sweep.best_trial_number"
    SWEEP_BEST_RUN = "mlops.sweep.best_run_id"
    SWEEP_STORAGE = "mlops.sweep.storage"
    PREVIOUS_RUN = "mlops.previous_run_id"
    RESUME_CHANGES = "mlops.resume_changes"
    # Training as a service (`mlops train submit`): who asked, for which team, and where it ran.
    TEAM = "mlops.team"  # the team a run, snapshot build or job belongs to (its quota is charged)
    JOB_ID = "mlops.job_id"  # the Ray job (submission id) that ran it
    CLUSTER = "mlops.cluster"  # the Ray cluster's dashboard address the job ran on
    SUBMITTED_BY = "mlops.submitted_by"  # the authenticated identity that submitted the job
    PRIORITY = "mlops.priority"  # high, normal or low
    # Best-checkpoint selection (train.select): the checkpoint the final model was built from, and why.
    SELECTED_STEP = "mlops.selected_step"
    SELECTED_METRIC = "mlops.selected_metric"  # the metric and mode, "val_loss min"
    SELECTED_VALUE = "mlops.selected_value"
    SELECTED_CHECKPOINT = "mlops.selected_checkpoint"  # the checkpoint folder (prune never deletes it)
    EARLY_STOPPED = "mlops.early_stopped"  # why the run ended before train.max_steps


def code_version() -> str:
    try:
        version = importlib.metadata.version("mlops-llm")
    except importlib.metadata.PackageNotFoundError:
        version = "0+unknown"
    return f"{version}+pipeline{PIPELINE_VERSION}"


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(cwd: Path | None = None) -> tuple[str, bool]:
    """(commit, dirty) of the source tree; ('unknown', True) outside a git checkout."""
    root = cwd or Path(__file__).resolve().parent.parent
    commit = _git(["rev-parse", "HEAD"], root)
    if not commit:
        return "unknown", True
    status = _git(["status", "--porcelain", "--untracked-files=no"], root)
    return commit, bool(status)


@functools.lru_cache(maxsize=1)
def environment_fingerprint() -> str:
    """Hash of the python version, platform and every installed distribution with its version.

    Computed once per process (~0.7 s), so a run and everything it logs carry one tag even if packages
    are installed while it runs."""
    packages = sorted(
        f"{(d.metadata['Name'] or '').lower()}=={d.version}" for d in importlib.metadata.distributions()
    )
    blob = "\n".join([sys.version, platform.platform(), platform.machine(), *packages])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def image_tag() -> tuple[str, bool]:
    """(tag, mutable). The Dockerfile pins the runtime and sets MLOPS_IMAGE_TAG; without it the tag is
    derived from the environment and marked mutable, since nothing stops that environment changing."""
    pinned = os.environ.get(IMAGE_TAG_ENV, "").strip()
    if pinned:
        return pinned, False
    return f"local-{environment_fingerprint()}", True


@dataclass(frozen=True)
class Lineage:
    config_hash: str
    image_tag: str
    image_tag_mutable: bool
    git_commit: str
    git_dirty: bool
    code_version: str
    seed: int
    base_model: str | None = None
    base_model_id: str | None = None
    snapshot_id: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    actor: str | None = None
    actor_verified: bool = False

    def as_tags(self) -> dict[str, str]:
        tags = {
            Tag.CONFIG_HASH: self.config_hash,
            Tag.IMAGE_TAG: self.image_tag,
            Tag.IMAGE_TAG_MUTABLE: str(self.image_tag_mutable).lower(),
            Tag.GIT_COMMIT: self.git_commit,
            Tag.GIT_DIRTY: str(self.git_dirty).lower(),
            Tag.CODE_VERSION: self.code_version,
            Tag.SEED: str(self.seed),
        }
        optional = {
            Tag.BASE_MODEL: self.base_model,
            Tag.BASE_MODEL_ID: self.base_model_id,
            Tag.SNAPSHOT_ID: self.snapshot_id,
        }
        tags.update({k: v for k, v in optional.items() if v is not None})
        if self.actor:
            tags[Tag.ACTOR] = self.actor
            tags[Tag.ACTOR_VERIFIED] = str(self.actor_verified).lower()
        tags.update(self.extra)
        return {str(k): str(v) for k, v in tags.items()}

    def as_dict(self) -> dict:
        return asdict(self)


def collect_lineage(
    config_hash: str,
    seed: int,
    *,
    base_model: str | None = None,
    base_model_id: str | None = None,
    snapshot_id: str | None = None,
    extra: dict[str, str] | None = None,
) -> Lineage:
    from mlops.identities import PASSWORD_ENV, acting_name

    tag, mutable = image_tag()
    commit, dirty = git_state()
    actor = acting_name()
    return Lineage(
        actor=actor,
        actor_verified=bool(actor and os.environ.get(PASSWORD_ENV)),
        config_hash=config_hash,
        image_tag=tag,
        image_tag_mutable=mutable,
        git_commit=commit,
        git_dirty=dirty,
        code_version=code_version(),
        seed=seed,
        base_model=base_model,
        base_model_id=base_model_id,
        snapshot_id=snapshot_id,
        extra={str(k): str(v) for k, v in (extra or {}).items()},
    )


def enforce_release(lineage: Lineage, release: bool) -> None:
    """Strict mode: a release must be reproducible from an immutable image and a committed tree."""
    if not release:
        return
    problems = []
    if lineage.image_tag_mutable:
        problems.append(
            f"the image tag '{lineage.image_tag}' is mutable (no {IMAGE_TAG_ENV} set); "
            "build and run inside the pinned image from the Dockerfile, which sets it"
        )
    if lineage.git_dirty:
        problems.append(
            f"the git tree at commit {lineage.git_commit[:12]} has uncommitted changes; commit or stash them"
        )
    if problems:
        raise StrictModeError(
            "release mode (run.release=true) refuses to start: " + "; and ".join(problems) + ". "
            "Fix those, or run with run.release=false for an experiment."
        )


# What a registered version must be traceable to: the registry's lineage gate, and the replay that re-derives it.
REQUIRED_LINEAGE = (Tag.CONFIG_HASH, Tag.SNAPSHOT_ID, Tag.DATA_RUN, Tag.IMAGE_TAG, Tag.GIT_COMMIT, Tag.CODE_VERSION,
                    Tag.BASE_MODEL_ID, Tag.SEED, Tag.CHECKPOINT_MANIFEST, Tag.MODEL_ID, Tag.PROFILE_HASH)


def missing_lineage(tags: dict[str, str]) -> list[str]:
    return [str(t) for t in REQUIRED_LINEAGE if not str(tags.get(t, "")).strip()]
