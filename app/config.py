"""The `app:` config section: how the approval app is served and how long a login and a registry read last."""

from __future__ import annotations

import json
import os

from mlops.config import StrictModel, volatile

SETTINGS_ENV = "MLOPS_APP_SETTINGS"  # the resolved section, as JSON, handed from `mlops app` to the app process


class AppConfig(StrictModel):
    address: str = volatile("127.0.0.1", description="interface the app listens on (0.0.0.0 to share it)")
    port: int = volatile(8501, ge=1, le=65535, description="port the app listens on")
    session_timeout_min: float = volatile(
        30.0, gt=0, description="minutes without any interaction after which a login expires"
    )
    cache_ttl_s: float = volatile(
        30.0, ge=0, description="seconds a registry read is reused before it is read again; every action clears "
        "them at once, and every action re-checks the rules on fresh state anyway"
    )
    mlflow_ui_url: str | None = volatile(
        None, description="base URL of an MLflow UI, to link runs (default: the tracking URI when it is an "
        "http(s) tracking server; none for the embedded store)"
    )
    max_samples: int = volatile(
        25, ge=1, le=500, description="sample-level differences shown per task and direction on Compare"
    )


def settings() -> AppConfig:
    """The app's settings: what `mlops app` resolved (MLOPS_APP_SETTINGS), else the defaults."""
    raw = os.environ.get(SETTINGS_ENV, "").strip()
    return AppConfig.model_validate(json.loads(raw)) if raw else AppConfig()
