"""Layer 2 (pure): the `registry:` config section: the release policy for the human spot-check, the shadow test and the canary.

The policy in force lives in the governed store: the newest `policy` entry of the ledger's governance stream,
recorded at `mlops registry bootstrap` (from `configs/registry/release.yaml` under the project home, or the
defaults) and changed only by `mlops registry policy set FILE`, a ledgered admin act. No environment variable or
working folder chooses it. An act in a project whose `configs/registry/release.yaml` says something else than the
recorded policy is refused until an admin records the file (or it is restored), so a policy edit can never apply
silently, nor be ignored silently. Each gate result records the policy values it was judged by.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from mlops.config import StrictModel


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


class RegistryConfig(StrictModel):
    spot_check: SpotCheckPolicy = Field(default_factory=SpotCheckPolicy)
    shadow: ShadowPolicy = Field(default_factory=ShadowPolicy)
    canary: CanaryPolicy = Field(default_factory=CanaryPolicy)


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
