"""The `eval:` config section. Owned by evaluation."""

from __future__ import annotations

from pydantic import Field

from mlops.config import StrictModel


class EvalConfig(StrictModel):
    suites: list[str] = Field(default_factory=lambda: ["general", "business"], description="registered eval suites")
    limit: int | None = Field(None, ge=1, description="items per task (None: all)")
    margin: float = Field(0.02, ge=0, description="non-inferiority margin for general tasks")
