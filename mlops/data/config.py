"""The `data:` config section (data snapshot builds). Owned by the data pipeline."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from mlops.config import HASH_EXCLUDED, StrictModel, volatile


class SourceConfig(StrictModel):
    path: str = Field(description="JSONL, Parquet or CSV file (relative paths are under the project home)")
    domain: str | None = Field(None, description="capability domain for records that name none")
    format: Literal["auto", "jsonl", "parquet", "csv"] = Field("auto", description="file format; auto = by suffix")


def _known(kind: str, names: list[str], registry_of) -> list[str]:
    """Registered names only, checked when the config is read: a typo never reaches a worker process."""
    from mlops.errors import did_you_mean

    registry = registry_of()
    for name in names:
        if name not in registry:
            raise ValueError(f"unknown {kind} '{name}': {did_you_mean(name, registry.names())}")
    if len(set(names)) != len(names):
        raise ValueError(f"{kind}s {sorted({n for n in names if names.count(n) > 1})} are listed more than once")
    return names


def _pii_registry():
    from mlops.data.pii import DETECTORS

    return DETECTORS


def _filter_registry():
    from mlops.data.filters import FILTERS

    return FILTERS


def _suite_registry():
    from mlops.data.gate import SUITES

    return SUITES


class PIIConfig(StrictModel):
    enabled: bool = Field(True, description="replace PII with typed placeholders such as [EMAIL]")
    types: list[str] = Field(
        default_factory=lambda: ["api_key", "email", "iban", "credit_card", "national_id", "ip_address",
                                 "date_of_birth", "password", "phone", "address", "name"],
        description="PII detectors to run (see mlops.data.pii.DETECTORS); overlaps are settled most specific first",
    )

    @field_validator("types")
    @classmethod
    def _registered(cls, value: list[str]) -> list[str]:
        return _known("PII detector", value, _pii_registry)


class BlocklistConfig(StrictModel):
    path: str = Field(description="term or regex list file, one entry per line (relative paths are under the "
                      "project home; format in mlops.data.blocklist)")
    case_sensitive: bool = Field(False, description="compare case as written (default: case-insensitive)")


class FilterConfig(StrictModel):
    steps: list[str] = Field(
        default_factory=lambda: [
            "empty_assistant",
            "length",
            "url_ratio",
            "symbol_ratio",
            "short_answer",
            "encoded_blob",
            "markup",
            "char_repetition",
            "repeated_ngrams",
            "mixed_language",
            "language",
        ],
        description="registered quality filters to run, in order (see mlops.data.filters.FILTERS)",
    )
    min_chars: int = Field(16, ge=0, description="shortest record text in characters")
    max_chars: int = Field(4000, ge=1, description="longest record text in characters")
    max_url_ratio: float = Field(0.3, ge=0, le=1, description="largest share of characters inside URLs")
    max_symbol_ratio: float = Field(0.2, ge=0, le=1, description="largest share of non-space chars that are symbols")
    repeated_ngram: int = Field(3, ge=1, description="word n-gram size for the repetition filter")
    max_repeated_ngram_ratio: float = Field(0.3, ge=0, le=1, description="largest share of repeated word n-grams")
    max_mixed_language_ratio: float = Field(
        0.2, ge=0, le=1, description="largest share of letters outside the record's dominant script"
    )
    min_answer_words: int = Field(3, ge=0, description="fewest words in every assistant turn (one-word answers)")
    max_blob_ratio: float = Field(
        0.2, ge=0, le=1, description="largest share of characters in base64/hex-like runs of 48+ characters"
    )
    max_blob_chars: int = Field(256, ge=16, description="longest single base64/hex-like run in a record")
    max_markup_ratio: float = Field(0.2, ge=0, le=1, description="largest share of characters in HTML/XML tags, "
                                    "entities and BBCode")
    max_char_repetition_ratio: float = Field(
        0.2, ge=0, le=1, description="largest share of characters in runs of one short unit repeated ('aaaa', 'hahaha')"
    )
    languages: list[str] = Field(
        default_factory=lambda: ["en"], description="ISO 639-1 codes a record may be written in (empty: any)"
    )
    min_language_confidence: float = Field(
        0.5, ge=0, le=1, description="language id confidence needed to reject a record as another language"
    )
    # None stays out of the config hash, so configs without a blocklist keep their snapshot ids.
    blocklist: BlocklistConfig | None = Field(
        None, description="sensitive-term blocklist: a list file path (or {path, case_sensitive}); a record "
        "holding a listed term or regex is rejected as filter.blocklist. Runs where `blocklist` is in steps, "
        "else first"
    )

    @field_validator("blocklist", mode="before")
    @classmethod
    def _blocklist_path(cls, value):
        return {"path": value} if isinstance(value, str) else value

    @field_validator("steps")
    @classmethod
    def _registered(cls, value: list[str]) -> list[str]:
        return _known("quality filter", value, _filter_registry)

    @field_validator("languages")
    @classmethod
    def _iso_codes(cls, value: list[str]) -> list[str]:
        from mlops.data.filters import LANGUAGES

        for code in value:
            if code not in LANGUAGES:
                from mlops.errors import did_you_mean

                raise ValueError(f"unknown language code '{code}': {did_you_mean(code, LANGUAGES)}")
        return value


class DedupConfig(StrictModel):
    exact: bool = Field(True, description="drop records whose normalised text was already seen")
    near: bool = Field(True, description="drop near duplicates found with MinHash LSH")
    threshold: float = Field(0.7, gt=0, lt=1, description="estimated Jaccard similarity that makes a near duplicate")
    num_perm: int = Field(128, ge=16, le=1024, description="MinHash permutations")
    shingle: int = Field(3, ge=1, description="word n-gram size of the MinHash shingles")
    index: Literal["disk", "memory"] = volatile(
        "disk", description="no longer used (kept so older configs load): since pipeline 2 the build's dedup is "
        "sharded by band on the workers' disks (mlops.data.lsh)"
    )
    against_snapshots: list[str] = Field(
        default_factory=list, description="earlier snapshot ids whose records count as already seen"
    )


class ContaminationRule(StrictModel):
    """When a training text holds an eval item: the one definition shared by the snapshot build's
    decontamination and the eval contamination report (both go through `mlops.data.decontam.EvalIndex`).

    Texts are compared after normalisation (Unicode NFKC, case, punctuation, contractions, number words,
    plural and tense endings). An eval text leaks into one training message when they share an `ngram`-word
    run, or when the message holds `fuzzy_containment` (and at least `fuzzy_min_shared`) of the eval text's
    `fuzzy_shingle`-word shingles and `fuzzy_content` of its content words (a paraphrase that swaps or inserts
    a few words). Question texts shorter than `ngram` words match whole; those shorter than `min_words` are
    too generic to call a leak. Answer texts (choices, targets, aliases) are what a policy corpus must teach,
    so they count only as a verbatim run of `ngram` words, never whole or by paraphrase ("30 days").
    """

    ngram: int = Field(8, ge=4, description="shared normalised word n-gram length that makes a verbatim leak")
    min_words: int = Field(6, ge=3, description="shortest eval text (in words) that is checked at all")
    fuzzy_shingle: int = Field(3, ge=2, description="word shingle size of the paraphrase check")
    fuzzy_containment: float = Field(
        0.5, gt=0, le=1, description="share of an eval text's shingles inside one training message that makes "
        "a paraphrased leak (1.0: every shingle)"
    )
    fuzzy_min_shared: int = Field(
        4, ge=1, description="fewest shared shingles for a paraphrase match: a short question sharing a 5-word "
        "phrase with a policy statement is no paraphrase of it"
    )
    fuzzy_content: float = Field(
        0.75, ge=0, le=1, description="share of the eval text's content words (not function words) the message "
        "must also hold: a paraphrase keeps the key terms, another question on the same stem does not"
    )

    @model_validator(mode="after")
    def _sizes(self) -> ContaminationRule:
        if self.min_words > self.ngram:
            raise ValueError(f"min_words ({self.min_words}) must not exceed ngram ({self.ngram}); lower min_words")
        if self.fuzzy_shingle >= self.min_words:
            raise ValueError(f"fuzzy_shingle ({self.fuzzy_shingle}) must be below min_words ({self.min_words})")
        return self

    def rule(self) -> ContaminationRule:
        """The rule alone (without the settings of a section that extends it)."""
        return ContaminationRule(**{k: getattr(self, k) for k in ContaminationRule.model_fields})


class DecontamConfig(ContaminationRule):
    eval_sets: list[str] = Field(
        default_factory=list, description="JSONL eval files or globs; training records that hold an eval item "
        "under the contamination rule (the fields of this section) are dropped"
    )


class HistoryConfig(StrictModel):
    snapshot: str = Field(description="snapshot id whose train samples are mixed into this one")
    ratio: float = Field(0.3, gt=0, lt=1, description="share of history samples in the train split (7:3 -> 0.3)")


class MixConfig(StrictModel):
    ratios: dict[str, float] = Field(
        default_factory=dict, description="target share per capability domain; empty keeps the natural mix"
    )
    tolerance: float = Field(0.05, ge=0, le=1, description="allowed |batch share - target| per domain in the gate")
    history: HistoryConfig | None = Field(None, description="incremental mode: mix with a historical snapshot")

    @model_validator(mode="after")
    def _positive(self) -> MixConfig:
        bad = {k: v for k, v in self.ratios.items() if v < 0}
        if bad:
            raise ValueError(f"domain ratios must be >= 0, got {bad}")
        if self.ratios and sum(self.ratios.values()) <= 0:
            raise ValueError("domain ratios must not all be 0")
        return self


class GateConfig(StrictModel):
    suite: str = Field("snapshot_batch", description="registered expectation suite (see `mlops data suites`)")
    max_truncated_share: float = Field(
        0.25, ge=0, le=1, description="largest share of truncated records in a batch (data.overlong=truncate)"
    )
    on_batch_failure: Literal["fail", "quarantine"] = Field(
        "fail", description="a failing batch stops the build (fail) or is set aside whole (quarantine)"
    )
    min_tokens: int = Field(8, ge=1, description="fewest tokens in a tokenized record (checked per record)")
    max_dup_ratio: float = Field(0.01, ge=0, le=1, description="largest share of duplicate texts in a batch")
    min_loss_share: float = Field(0.05, ge=0, le=1, description="smallest mean share of assistant (loss) tokens")

    @field_validator("suite")
    @classmethod
    def _registered(cls, value: str) -> str:
        _known("expectation suite", [value], _suite_registry)
        return value


RAY_ADDRESS = re.compile(r"auto|(ray://)?[A-Za-z0-9_.\-]+:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}")


class RayConfig(StrictModel):
    """Where and how `data.executor: ray` runs the per-record work. None of it changes the snapshot (the driver
    assembles results in input order), so the whole section is left out of the config hash."""

    address: str | None = Field(
        None, description="Ray cluster to run on: auto (the cluster this node joined), host:port of the head's "
        "GCS (`ray start --head --port=...`), or ray://host:port (Ray Client, needs ray[client]); unset: start a "
        "private Ray in the build process with data.workers CPUs"
    )
    num_cpus: float = Field(1.0, gt=0, le=64, description="CPUs one task reserves (0.5 runs two tasks per CPU)")
    max_in_flight: int | None = Field(
        None, ge=1, description="chunks submitted and not yet collected (memory bound on the driver); "
        "unset: 2 per task slot of the cluster"
    )
    max_retries: int = Field(3, ge=0, le=20, description="times a task is rerun when its worker or node dies")
    head_timeout_s: float = Field(
        10.0, ge=1, le=50, description="seconds the head may stay unreachable before the build fails (Ray "
        "itself ends a driver whose head is gone for 60 s)"
    )
    object_store_mb: int = Field(256, ge=64, description="object store of the private Ray (address unset)")

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None or RAY_ADDRESS.fullmatch(value.strip()):
            return None if value is None else value.strip()
        raise ValueError(f"data.ray.address '{value}' is not a Ray address. Fix: use auto, host:port of the head "
                         "(the --port of `ray start --head`), ray://host:port, or leave it unset for a private Ray")


class AcceptConfig(StrictModel):
    """The acceptance step (mlops.data.acceptance). It judges a snapshot and never changes its content, so the
    whole section is left out of the config hash: setting it keeps every snapshot id."""

    max_rejected_share: float = Field(
        0.05, ge=0, le=1, description="largest share of rows read that quality steps may reject (bad input, "
        "errors, filters, per-record checks, refused batches; duplicates and eval overlaps are reported, not "
        "judged)"
    )
    min_rows: int = Field(
        100, ge=0, description="fewest rows read for an over-threshold share to fail the build; below it the "
        "build is flagged (a share of a handful of rows, e.g. a harvested increment, cannot tell dirty data from "
        "one bad row)"
    )
    on_fail: Literal["fail", "flag"] = Field(
        "fail", description="over the threshold the build fails and publishes nothing (fail), or publishes a "
        "snapshot whose report says flagged (flag)"
    )
    max_seq_len: int | None = Field(
        None, ge=16, description="sequence length whose truncated share the report gives (default data.seq_len)"
    )
    require_review: bool = Field(
        False, description="training refuses this snapshot until `mlops data review` holds a completed review"
    )


class DataConfig(StrictModel):
    name: str = Field("snapshot", description="human-readable snapshot name")
    sources: list[SourceConfig] = Field(default_factory=list, description="input files")
    default_domain: str = Field("general", description="domain for records whose record and source name none")
    on_bad_record: Literal["fail", "skip"] = Field(
        "fail", description="a malformed record stops the build (fail) or is reported and quarantined (skip)"
    )
    batch_size: int = Field(256, ge=1, description="records per Great Expectations gated batch")
    seq_len: int = Field(512, ge=16, description="tokens per packed training sequence")
    overlong: Literal["drop", "truncate"] = Field(
        "drop", description="a record longer than seq_len tokens is dropped or truncated to seq_len, by itself"
    )
    min_records: int = volatile(
        1, ge=1, description="fewest records the snapshot must hold; a build below it fails and publishes nothing"
    )
    excerpt_chars: int = volatile(
        500, ge=0, le=100_000, description="characters per message kept, PII-redacted, for a quarantined record"
    )
    pack: bool = Field(False, description="pack several records into one sequence instead of one per sequence")
    validation_fraction: float = Field(0.05, ge=0, lt=1, description="share of records held out by record id")
    shard_size: int = Field(4096, ge=1, description="samples per memory-mapped shard")
    pii: PIIConfig = Field(default_factory=PIIConfig)
    filters: FilterConfig = Field(default_factory=FilterConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    decontam: DecontamConfig = Field(default_factory=DecontamConfig)
    mix: MixConfig = Field(default_factory=MixConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    accept: AcceptConfig = Field(default_factory=AcceptConfig, json_schema_extra={HASH_EXCLUDED: True},
                                 description="acceptance report thresholds and review (never change the snapshot)")
    workers: int = volatile(2, ge=1, description="processes for the per-record work (local executor), or CPUs "
                            "of the private Ray (executor ray without data.ray.address); never changes results")
    executor: Literal["local", "ray"] = volatile(
        "local", description="where the per-record work runs: local (a process pool on this machine) or ray (Ray "
        "tasks on data.ray.address); the same inputs give the same snapshot on either"
    )
    ray: RayConfig = Field(default_factory=RayConfig, json_schema_extra={HASH_EXCLUDED: True},
                           description="data.executor=ray settings (never change results)")
    output_dir: str | None = volatile(None, description="where snapshots are written (default .mlops/snapshots)")
