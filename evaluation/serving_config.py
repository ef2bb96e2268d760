"""The `serve:` config section: limits, scheduling, shutdown and auth of `mlops serve`. Owned by evaluation."""

from __future__ import annotations

from pydantic import Field

from mlops.config import StrictModel

DEFAULT_KEYS_FILE = ".mlops/serve/api_keys.json"


class AuthConfig(StrictModel):
    enabled: bool = Field(True, description="require `Authorization: Bearer <key>` (off only with --no-auth)")
    keys_file: str = Field(
        DEFAULT_KEYS_FILE, description="hashed API keys (`mlops serve keys add`); relative to the project home"
    )
    open_metrics: bool = Field(False, description="serve /metrics without a key (a scraper on a private network)")


class ServeConfig(StrictModel):
    max_body_bytes: int = Field(4 * 2**20, ge=1024, description="largest request body; bigger ones get 413")
    max_prompts: int = Field(128, ge=1, description="prompts in one /v1/completions request")
    max_request_tokens: int = Field(
        32768, ge=16, description="prompt tokens plus requested completion tokens of one request, all prompts together"
    )
    max_batch_tokens: int = Field(4096, ge=64, description="tokens the engine runs in one batch")
    max_batch_rows: int = Field(8, ge=1, description="generation requests decoded together")
    slice_steps: int = Field(
        16, ge=1, description="decode steps before waiting requests may join or take a turn (fairness)"
    )
    drain_timeout: float = Field(
        30.0, ge=0, description="seconds SIGTERM waits for running requests before cutting them (exit 0 when drained)"
    )
    ready_stall_seconds: float = Field(
        120.0, gt=0, description="/ready fails when the engine made no progress this long with work waiting"
    )
    access_log: bool = Field(True, description="one JSON line per request on the `mlops.serve.access` logger")
    auth: AuthConfig = Field(default_factory=AuthConfig)
