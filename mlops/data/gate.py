"""The Great Expectations gate: every batch is validated with a registered, versioned suite before it may
enter the snapshot.

A batch is a pandas frame with one row per tokenized record that passed its own checks (`COLUMNS`; no text,
so a GE report never quotes a record). What one record can get wrong (length, token bounds, loss tokens,
PII) is checked per record before the batch is formed (mlops.data.filters, mlops.data.checks); the suite
holds what only a batch shows: the schema, unique ids, the duplicate share, domain shares, the mean share of
assistant tokens, the share of truncated records. Batch-level facts that GE checks per row are broadcast into
columns: `domain_share_dev` is how far the record's domain share in this batch is from its target beyond
the rounding a batch of n records cannot avoid (1/n), clipped at 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlops.plugins import Registry

COLUMNS = [
    "record_id", "source", "line", "domain", "kind", "text_chars", "text_hash",
    "n_tokens", "loss_tokens", "loss_share", "truncated", "domain_share_dev",
]
# A preference batch: one row per pair (tokens and loss over both of its rows, text_hash of prompt + chosen), plus
# what only pairs have: the answers' lengths, their ratio, and whether they say the same words (mlops.data.pairs).
PAIR_COLUMNS = [*COLUMNS, "chosen_chars", "rejected_chars", "length_ratio", "identical"]


@dataclass(frozen=True)
class GateParams:
    max_dup_ratio: float
    min_loss_share: float
    tolerance: float
    max_truncated_share: float = 1.0
    domains: list[str] = field(default_factory=list)  # empty: any domain
    # preference batches only (data.pairs)
    max_identical_share: float = 1.0
    min_length_ratio: float = 0.0
    max_length_ratio: float = float("inf")


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    version: int
    description: str
    build: Callable[[GateParams], list[Any]]

    @property
    def key(self) -> str:
        return f"{self.name}@v{self.version}"


SUITES: Registry[SuiteSpec] = Registry("expectation suite")


def _snapshot_batch_v2(p: GateParams) -> list[Any]:
    import great_expectations as gx

    E = gx.expectations
    out = [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        E.ExpectTableColumnsToMatchSet(column_set=COLUMNS, exact_match=True),
        *[E.ExpectColumnValuesToNotBeNull(column=c) for c in ("record_id", "source", "domain", "kind")],
        E.ExpectColumnValuesToBeInSet(column="kind", value_set=["chat", "instruction", "text"]),
        E.ExpectColumnValuesToBeUnique(column="record_id"),
        E.ExpectColumnProportionOfUniqueValuesToBeBetween(column="text_hash", min_value=1 - p.max_dup_ratio),
        E.ExpectColumnValuesToBeBetween(column="domain_share_dev", min_value=0, max_value=p.tolerance),
        E.ExpectColumnMeanToBeBetween(column="loss_share", min_value=p.min_loss_share, max_value=1),
        E.ExpectColumnMeanToBeBetween(column="truncated", min_value=0, max_value=p.max_truncated_share),
    ]
    if p.domains:
        out.append(E.ExpectColumnValuesToBeInSet(column="domain", value_set=sorted(p.domains)))
    return out


SUITES.add("snapshot_batch", SuiteSpec(
    "snapshot_batch", 2,
    "batch-level only (per-record checks run before batching): schema and non-null fields, unique ids, "
    "duplicate share, domain shares within tolerance, mean assistant (loss) share, share of truncated records",
    _snapshot_batch_v2,
))


def _preference_batch_v1(p: GateParams) -> list[Any]:
    import great_expectations as gx

    E = gx.expectations
    out = [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        E.ExpectTableColumnsToMatchSet(column_set=PAIR_COLUMNS, exact_match=True),
        *[E.ExpectColumnValuesToNotBeNull(column=c) for c in ("record_id", "source", "domain", "kind")],
        E.ExpectColumnValuesToBeInSet(column="kind", value_set=["pair"]),
        E.ExpectColumnValuesToBeUnique(column="record_id"),
        E.ExpectColumnProportionOfUniqueValuesToBeBetween(column="text_hash", min_value=1 - p.max_dup_ratio),
        E.ExpectColumnValuesToBeBetween(column="domain_share_dev", min_value=0, max_value=p.tolerance),
        E.ExpectColumnMeanToBeBetween(column="loss_share", min_value=p.min_loss_share, max_value=1),
        E.ExpectColumnMaxToBeBetween(column="truncated", min_value=0, max_value=0),  # a pair is never truncated
        E.ExpectColumnMeanToBeBetween(column="identical", min_value=0, max_value=p.max_identical_share),
        E.ExpectColumnMedianToBeBetween(column="length_ratio", min_value=p.min_length_ratio,
                                        max_value=p.max_length_ratio),
    ]
    if p.domains:
        out.append(E.ExpectColumnValuesToBeInSet(column="domain", value_set=sorted(p.domains)))
    return out


SUITES.add("preference_batch", SuiteSpec(
    "preference_batch", 1,
    "preference pairs, batch-level (per-pair checks run before batching): schema, unique pair ids, duplicate share "
    "of prompt + chosen, domain shares within tolerance, mean answer (loss) share, no truncation, share of pairs "
    "whose answers say the same words, median chosen/rejected length ratio",
    _preference_batch_v1,
))


@dataclass
class GateResult:
    success: bool
    failed: list[dict]
    report: dict
    evaluated: int


def _failure(res: Any) -> dict:
    config = res.expectation_config
    result = res.result or {}
    partial = result.get("partial_unexpected_list") or []
    out = {
        "expectation": config.type,
        "column": config.kwargs.get("column"),
        "unexpected_count": result.get("unexpected_count"),
        "observed_value": _plain(result.get("observed_value")),
        "examples": [str(v)[:120] for v in partial[:3]],
    }
    if res.exception_info and res.exception_info.get("raised_exception"):
        out["exception"] = str(res.exception_info.get("exception_message"))[:300]
    return {k: v for k, v in out.items() if v is not None and not (isinstance(v, list) and not v)}


def _plain(value: Any) -> Any:
    """JSON-ready: GE reports numpy values for some expectations."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value][:20]
    return value


class Gate:
    """One GE context, batch definition and suite per process; `validate(frame)` per batch."""

    def __init__(self, suite_name: str, params: GateParams) -> None:
        import great_expectations as gx

        logging.getLogger("great_expectations").setLevel(logging.ERROR)
        self.spec = SUITES.get(suite_name)
        context = gx.get_context(mode="ephemeral")
        try:
            from great_expectations.data_context.types.base import ProgressBarsConfig

            context.variables.progress_bars = ProgressBarsConfig(globally=False)
        except Exception:  # noqa: BLE001 - progress bars are cosmetic
            pass
        asset = context.data_sources.add_pandas("mlops_data").add_dataframe_asset(name="batch")
        batch_definition = asset.add_batch_definition_whole_dataframe("whole_batch")
        suite = context.suites.add(gx.ExpectationSuite(name=self.spec.key))
        for expectation in self.spec.build(params):
            suite.add_expectation(expectation)
        self.expectations = len(suite.expectations)
        self.batch_definition, self.suite = batch_definition, suite

    def validate(self, frame) -> GateResult:
        """A verdict first (GE's BOOLEAN_ONLY costs half of a summary: a passing batch keeps no report); a
        failing batch is validated again with a summary, the report its quarantine folder keeps."""
        batch = self.batch_definition.get_batch(batch_parameters={"dataframe": frame})
        verdict = batch.validate(self.suite, result_format="BOOLEAN_ONLY")
        if verdict.success:
            return GateResult(True, [], {"success": True}, len(verdict.results))
        result = batch.validate(self.suite, result_format="SUMMARY")
        failed = [_failure(r) for r in result.results if not r.success]
        return GateResult(bool(result.success), failed, result.to_json_dict(), len(result.results))


_GATES: dict[str, Gate] = {}


def validate_batch(suite: str, params: GateParams, frame) -> GateResult:
    """Validate with a Gate built once per process and suite/params (workers keep theirs between batches)."""
    key = f"{suite}|{params!r}"
    if key not in _GATES:
        _GATES.clear()
        _GATES[key] = Gate(suite, params)
    return _GATES[key].validate(frame)


def share_deviation(domains: list[str], targets: dict[str, float]) -> list[float]:
    """Per row: |share of its domain in this batch - target| beyond the 1/n rounding allowance."""
    n = len(domains)
    counts: dict[str, int] = {}
    for d in domains:
        counts[d] = counts.get(d, 0) + 1
    dev = {d: max(0.0, abs(c / n - targets.get(d, 0.0)) - 1 / n) for d, c in counts.items()}
    return [round(dev[d], 6) for d in domains]
