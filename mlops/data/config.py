"""The `data:` config section (data snapshot builds). Owned by the data pipeline."""

from __future__ import annotations

from pydantic import Field

from mlops.config import StrictModel, volatile


class SourceConfig(StrictModel):
    path: str = Field(description="JSONL, Parquet or CSV file")
    domain: str | None = Field(None, description="capability domain for every record of this source")


class DataConfig(StrictModel):
    name: str = Field("snapshot", description="human-readable snapshot name")
    sources: list[SourceConfig] = Field(default_factory=list, description="input files")
    batch_size: int = Field(256, ge=1, description="records per Great Expectations gated batch")
    seq_len: int = Field(512, ge=16, description="tokens per packed training sequence")
    output_dir: str | None = volatile(None, description="where snapshots are written (default .mlops/snapshots)")
