"""The `registry:` config section: the release policy for the human spot-check, the shadow test and the canary.

A policy is the project's, not a run's: promotion reads it from `configs/registry/release.yaml` under the project
home (`MLOPS_RELEASE_POLICY` names another file), a YAML file holding one `registry:` block. The same block is
accepted in any stage config (the section is registered with the core), so a team can keep it in one place.
Without a file every new gate is off (`required: false`), which keeps existing release paths as they were.
Each gate result records the policy values it was judged by, so the ledger shows which rules applied.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from mlops.config import StrictModel

POLICY_ENV = "MLOPS_RELEASE_POLICY"


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
    max_error_rate: float = Field(0.02, ge=0, le=1, description="canary 5xx share that rolls it back")
    max_p95_ratio: float = Field(1.5, gt=0, description="canary p95 latency over the champion's that rolls it back")
    min_requests: int = Field(20, ge=1, description="requests each version must have served before it is judged")
    interval: float = Field(5.0, gt=0, description="seconds between two reads of /metrics")


class RegistryConfig(StrictModel):
    spot_check: SpotCheckPolicy = Field(default_factory=SpotCheckPolicy)
    shadow: ShadowPolicy = Field(default_factory=ShadowPolicy)
    canary: CanaryPolicy = Field(default_factory=CanaryPolicy)


def policy_path() -> Path:
    from mlops.paths import project_home

    explicit = os.environ.get(POLICY_ENV, "").strip()
    return Path(explicit).expanduser() if explicit else project_home() / "configs" / "registry" / "release.yaml"


def release_policy(path: Path | None = None) -> RegistryConfig:
    """The release policy in force: the `registry:` block of the policy file, or the defaults (all gates off)."""
    from mlops.config import read_yaml
    from mlops.errors import ConfigError

    path = path or policy_path()
    if not path.exists():
        if os.environ.get(POLICY_ENV, "").strip():
            raise ConfigError(f"{POLICY_ENV}={path} names no file. Fix: point it at a YAML file with a `registry:` "
                              "block, or unset it to use configs/registry/release.yaml.")
        return RegistryConfig()
    data = read_yaml(path)
    unknown = sorted(set(data) - {"registry"})
    if unknown:
        raise ConfigError(f"release policy {path} holds {', '.join(unknown)}; it takes one `registry:` block. "
                          "Fix: move those keys under `registry:` or delete them.")
    from mlops.config import validate_config

    return validate_config({"registry": data.get("registry") or {}}, source=str(path)).registry
