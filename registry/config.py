"""Layer 2 (pure): the `registry:` config section: the release policy for the human spot-check, the shadow test, the canary, the monitor and the loop trigger.

The policy in force lives in the governed store: the newest `policy` entry of the ledger's governance stream,
recorded at `mlops registry bootstrap` (from `configs/registry/release.yaml` under the project home, or the
defaults) and changed only by `mlops registry policy set FILE`, a ledgered admin act. No environment variable or
working folder chooses it. An act in a project whose `configs/registry/release.yaml` says something else than the
recorded policy is refused until an admin records the file (or it is restored), so a policy edit can never apply
silently, nor be ignored silently. Each gate result records the policy values it was judged by.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from mlops.config import StrictModel, added_option


class SpotCheckPolicy(StrictModel):
    required: bool = Field(False, description="promotion to production needs a passed human spot-check")
    sample_size: int = Field(30, ge=1, le=1000, description="items drawn per spot-check (`--n` overrides)")
    min_share_same_or_better: float = Field(
        0.8, ge=0, le=1, description="share of reviewed items whose challenger answer is at least as good as the "
        "champion's (better or same) for the gate to pass")
    served_share: float = Field(
        0.5, ge=0, le=1, description="share of the sample drawn from logged served requests, when the request log "
        "holds enough of them; the rest comes from the business suite, stratified by dimension")
    suite: str = Field("evaluation/suites/business", description="folder of business eval items (JSONL) to draw "
                       "prompts from (relative paths are under the project home)")
    max_tokens: int | None = Field(
        None, ge=1, description="cap on the answer length for review; default: the deployment profile's own")


class ShadowPolicy(StrictModel):
    required: bool = Field(False, description="promotion to production needs shadow-traffic evidence")
    min_requests: int = Field(100, ge=1, description="fewest shadowed requests the candidate must have answered")
    max_error_rate: float = Field(0.02, ge=0, le=1, description="largest share of shadow answers that failed")


class CanaryPolicy(StrictModel):
    max_share: float = Field(0.25, gt=0, le=1, description="largest share of traffic a canary may take")
    max_seconds: float = Field(86400.0, gt=0, le=7 * 86400, description="longest a canary may run (seconds)")
    max_error_rate: float = Field(0.02, ge=0, le=1, description="canary 5xx share that rolls it back")
    max_p95_ratio: float = Field(1.5, gt=0, description="canary p95 latency over the champion's that rolls it back")
    min_requests: int = Field(20, ge=1, description="requests each version must have served before it is judged")
    interval: float = Field(5.0, gt=0, description="seconds between two reads of /metrics")


class MonitorPolicy(StrictModel):
    """What `mlops monitor` alerts on: a signal of the recent days worse than its reference (the version's first
    days, or the previous champion) by more than the interval AND by more than the tolerance here."""

    recent_days: int = Field(3, ge=1, le=90, description="days of traffic judged against the references")
    baseline_days: int = Field(7, ge=1, le=90, description="a version's first days of traffic: its own baseline")
    min_requests: int = Field(50, ge=1, le=1_000_000, description="fewest answers on each side of a comparison")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="level of every interval (Wilson, order-statistic)")
    max_thumbs_down_increase: float = Field(0.05, ge=0, le=1, description="tolerated rise of the thumbs-down rate")
    max_correction_increase: float = Field(0.05, ge=0, le=1, description="tolerated rise of the correction rate")
    max_refusal_increase: float = Field(0.05, ge=0, le=1, description="tolerated rise of the refusal rate")
    max_repeat_increase: float = Field(0.05, ge=0, le=1, description="tolerated rise of the repeated-question rate")
    max_error_increase: float = Field(0.02, ge=0, le=1, description="tolerated rise of the error rate")
    max_p95_ratio: float = Field(1.5, ge=1, le=100, description="tolerated p95 latency over the reference's")
    repeat_window_seconds: float = Field(600.0, gt=0, le=7 * 86400, description="a near-duplicate question by the "
                                         "same key within this many seconds counts as a repeat")
    repeat_similarity: float = Field(0.6, gt=0, le=1, description="estimated Jaccard similarity (MinHash, as the "
                                     "data pipeline's near dedup) that makes two questions one repeated question")


class LoopPolicy(StrictModel):
    """When `mlops loop check` opens the next round (it never promotes)."""

    min_increment: int = Field(200, ge=1, le=10_000_000, description="accepted harvested records that open a round")
    max_age_days: float = Field(30.0, gt=0, le=3650, description="a production version older than this opens one")
    on_alert: bool = Field(True, description="an alert of `mlops monitor` opens one")
    launch_training: bool = Field(False, description="launch the training run (MLflow Projects) after the build")
    history_ratio: float = Field(0.3, gt=0, lt=1, description="history share of the next snapshot's train split")
    # Added later: at their defaults (SFT rounds only) they stay out of the recorded policy's hash.
    mode: Literal["sft", "dpo", "auto"] = added_option(
        "sft", description="what a round trains: sft on the accepted corrections, dpo on the accepted preference "
        "pairs (`mlops data harvest --pairs` into the same increment folder), or auto: dpo when min_pairs pairs are "
        "accepted, else sft"
    )
    min_pairs: int = added_option(100, ge=1, le=10_000_000, description="accepted harvested pairs that open a DPO "
                                  "round (mode dpo or auto)")


class FreshnessPolicy(StrictModel):
    """How fresh the ledger a verifier reads must be (`registry.freshness`): `registry.freshness.hours` (what the
    issue calls `registry.freshness_hours`). Set, every verified read and act needs a timestamp over a head the
    ledger holds, signed by an identity of one of `signer_roles` within that many hours (`mlops registry
    timestamp`, from cron, well within it); unset, nothing is enforced."""

    hours: float | None = Field(None, gt=0, le=24 * 366, description="longest a signed timestamp vouches for the "
                                "ledger (hours); unset: freshness not enforced")
    signer_roles: list[str] = Field(["admin"], min_length=1, description="roles whose identities may sign the "
                                    "timestamp (`mlops registry timestamp`)")

    @field_validator("signer_roles")
    @classmethod
    def _known_roles(cls, roles: list[str]) -> list[str]:
        from mlops.identities import ROLES

        unknown = [r for r in roles if r not in ROLES]
        if unknown:
            raise ValueError(f"registry.freshness.signer_roles names {', '.join(map(repr, unknown))}, no role. Fix: "
                             f"use some of {', '.join(ROLES)}.")
        return roles


class AttestorsPolicy(StrictModel):
    """Who may attest which evidence (`registry.attestation`): user names, or `role:<role>`. The gates count a
    statement only when its signer is named here for its kind, so a trainer cannot vouch for her own eval."""

    train: list[str] = Field(["role:trainer", "role:admin", "role:service"],
                             description="who may attest a training run's output (its trainer, or the service)")
    data: list[str] = Field(["role:trainer", "role:admin", "role:service"],
                            description="who may attest a snapshot build's GE results")
    eval: list[str] = Field(["role:approver", "role:admin", "role:service"],
                            description="who may attest an eval and its contamination report")
    eval_reference: list[str] = Field(["role:approver", "role:admin", "role:service"],
                                      description="who may attest an as-trained reference eval")
    gate: list[str] = Field(["role:approver", "role:admin", "role:service"],
                            description="who may attest a gate report")
    shadow: list[str] = Field(["role:approver", "role:admin", "role:service"],
                              description="who may attest a shadow report")
    package: list[str] = Field(["role:trainer", "role:admin", "role:service"],
                               description="who may attest (and sign the package of) a GGUF")

    @field_validator("*")
    @classmethod
    def _known_roles(cls, value: list[str]) -> list[str]:
        from mlops.identities import ROLES

        for item in value:
            role = item.removeprefix("role:")
            if item.startswith("role:") and role not in ROLES:
                raise ValueError(f"'{item}' names no role (roles: {', '.join(ROLES)}); write role:<role> or a name")
        return value


PRIORITIES = ("high", "normal", "low")  # the order pending training jobs start in


class TeamPolicy(StrictModel):
    """One product team of the training service (`registry.teams.<name>`): who submits for it, its monthly
    device-hour quota, how many of its jobs may run at once, and what other teams shared with it. Changed only
    by an admin's signed `mlops registry policy set`, so a grant, a quota raise or a new member is ledgered."""

    members: list[str] = Field(..., min_length=1, description="user names (registry identities) who may submit "
                               "jobs for the team and use its snapshots, checkpoints and models")
    quota_device_hours: float = Field(..., gt=0, description="device-hours (wall x devices, retries included) the "
                                      "team may use per calendar month (UTC)")
    max_concurrent: int = Field(1, ge=1, description="jobs of the team that may run at once; the rest wait")
    default_priority: Literal["high", "normal", "low"] = Field("normal", description="priority of a submission "
                                                               "that names none")
    granted: list[str] = Field(default_factory=list, description="other teams' data and models shared with this "
                               "team: `snapshot:<id>` or `model:<name>/<version>`")

    @field_validator("granted")
    @classmethod
    def _grant_form(cls, grants: list[str]) -> list[str]:
        for grant in grants:
            kind, _, ref = grant.partition(":")
            if kind not in ("snapshot", "model") or not ref or (kind == "model" and "/" not in ref):
                raise ValueError(f"grant '{grant}' is neither snapshot:<id> nor model:<name>/<version>. Fix: write "
                                 "e.g. snapshot:sample-3f2a9c or model:support-bot/4")
        return grants


class RegistryConfig(StrictModel):
    spot_check: SpotCheckPolicy = Field(default_factory=SpotCheckPolicy)
    shadow: ShadowPolicy = Field(default_factory=ShadowPolicy)
    canary: CanaryPolicy = Field(default_factory=CanaryPolicy)
    # Added later: at their defaults they stay out of the config hash, so configs keep theirs.
    monitor: MonitorPolicy = added_option(MonitorPolicy())
    loop: LoopPolicy = added_option(LoopPolicy())
    freshness: FreshnessPolicy = added_option(FreshnessPolicy())
    attestors: AttestorsPolicy = added_option(AttestorsPolicy())
    teams: dict[str, TeamPolicy] = added_option({}, description="the training service's teams (`mlops train "
                                                "submit --team`); none: submissions are refused")

    @field_validator("teams")
    @classmethod
    def _team_names(cls, teams: dict[str, TeamPolicy]) -> dict[str, TeamPolicy]:
        from mlops.tenancy import check_team_name

        for name in teams:
            check_team_name(name)
        return teams


def policy_path() -> Path:
    """The project's policy file (what `bootstrap` records, and what acts compare with the recorded policy)."""
    from mlops.paths import project_home

    return project_home() / "configs" / "registry" / "release.yaml"


def read_policy_file(path: Path) -> RegistryConfig:
    from mlops.config import read_yaml, validate_config
    from mlops.errors import ConfigError, NotFoundError

    if not path.is_file():
        raise NotFoundError(f"the release policy file {path} does not exist. Fix: pass a YAML file holding one "
                            "`registry:` block.")
    data = read_yaml(path)
    unknown = sorted(set(data) - {"registry"})
    if unknown:
        raise ConfigError(f"release policy {path} holds {', '.join(unknown)}; it takes one `registry:` block. "
                          "Fix: move those keys under `registry:` or delete them.")
    return validate_config({"registry": data.get("registry") or {}}, source=str(path)).registry


def project_policy() -> dict:
    """What bootstrap records: the project's policy file, or the defaults (every extra gate off)."""
    path = policy_path()
    return (read_policy_file(path) if path.is_file() else RegistryConfig()).model_dump(mode="json")


def recorded_policy(entries) -> dict | None:
    from registry.entries import GOVERNANCE

    found = [e for e in entries if e.model == GOVERNANCE and e.action == "policy"]
    return found[-1].evidence.get("policy") if found else None


def policy_of(recorded: dict | None) -> RegistryConfig:
    return RegistryConfig.model_validate(recorded or {})


def policy_file_conflict(recorded: dict | None) -> str | None:
    """Why an act must not run here: the project's policy file differs from the recorded policy (else None)."""
    path = policy_path()
    if not path.is_file():
        return None
    local = read_policy_file(path).model_dump(mode="json")
    if local == policy_of(recorded).model_dump(mode="json"):
        return None
    return (f"the release policy file {path} differs from the policy recorded in the ledger, so it is unclear "
            "which rules this act should follow. Nothing was changed. Fix: an admin records the file with "
            f"`mlops registry policy set {path}` (ledgered), or restore the file to the recorded policy "
            "(`mlops registry policy show`).")
