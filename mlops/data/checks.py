"""Per-record checks after tokenization, then the batch's Great Expectations run: one batch task in a worker.

Each record of a batch is tokenized and checked on its own: a template that cannot render it, more tokens
than `seq_len` (dropped, or truncated by `data.overlong`), fewer than `gate.min_tokens`, or no assistant
token left to train on sets aside that record alone, with its reason and a redacted excerpt. Only the
records that pass form the frame the suite validates, so one overlong record never costs its batch; the suite
looks at what only a batch shows (duplicate share, domain shares, mean loss share, truncated share).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlops.data.gate import GateParams, GateResult, share_deviation, validate_batch
from mlops.data.quarantine import excerpt
from mlops.data.tokenize import TemplateFailure, tokenizer


@dataclass(frozen=True)
class RecordPolicy:
    seq_len: int
    min_tokens: int
    overlong: str  # drop | truncate
    excerpt_chars: int


@dataclass
class Checked:
    position: int  # in the batch's rows
    ids: np.ndarray | None = None
    mask: np.ndarray | None = None
    truncated: bool = False
    reason: str = ""  # "" = passed
    detail: dict | None = None
    excerpt: list[dict] | None = None
    n_tokens: int = -1  # the whole record's tokens, before any truncation (-1: it could not be tokenized)
    rejected: tuple[np.ndarray, np.ndarray] | None = None  # a pair's rejected row (ids, mask); ids/mask: its chosen


BatchTask = tuple[list[dict], tuple[str, GateParams, dict, RecordPolicy]]


def check_record(position: int, record, policy: RecordPolicy) -> Checked:
    if record.kind == "pair":
        return check_pair(position, record, policy)
    try:
        ids, mask = tokenizer().encode(record)
    except TemplateFailure as err:
        return _reject(position, record, "template_error", {"error": str(err)}, policy)
    except Exception as err:  # noqa: BLE001 - a record the tokenizer chokes on costs itself, not its batch
        return _reject(position, record, "tokenize_error", {"error": type(err).__name__}, policy)
    n = len(ids)
    truncated = False
    if n > policy.seq_len:
        if policy.overlong == "drop":
            return _reject(position, record, "too_many_tokens", {"n_tokens": n, "seq_len": policy.seq_len}, policy,
                           n)
        ids, mask, truncated = ids[: policy.seq_len], mask[: policy.seq_len], True
    if len(ids) < policy.min_tokens:
        return _reject(position, record, "too_few_tokens", {"n_tokens": len(ids), "min_tokens": policy.min_tokens},
                       policy, n)
    if not mask.any():
        reason = "no_loss_tokens_after_truncation" if truncated else "no_loss_tokens"
        return _reject(position, record, reason, {"n_tokens": n}, policy, n)
    return Checked(position, ids, mask, truncated, n_tokens=n)


def check_pair(position: int, record, policy: RecordPolicy) -> Checked:
    """Both sides rendered with the chat template and trained on their answer only. A side over seq_len sets the
    pair aside whatever data.overlong says: a truncated side would compare answers the model never saw whole."""
    from mlops.data.pairs import side

    rows = []
    for role in ("chosen", "rejected"):
        try:
            rows.append(tokenizer().encode_answer(side(record, role)))
        except TemplateFailure as err:
            return _reject(position, record, "template_error", {"error": str(err), "side": role}, policy)
        except Exception as err:  # noqa: BLE001 - a pair the tokenizer chokes on costs itself, not its batch
            return _reject(position, record, "tokenize_error", {"error": type(err).__name__, "side": role}, policy)
    (chosen, chosen_mask), (rejected, rejected_mask) = rows
    sizes = {"chosen_tokens": len(chosen), "rejected_tokens": len(rejected)}
    n = max(sizes.values())
    if n > policy.seq_len:
        return _reject(position, record, "too_many_tokens", {**sizes, "seq_len": policy.seq_len}, policy, n)
    if min(sizes.values()) < policy.min_tokens:
        return _reject(position, record, "too_few_tokens", {**sizes, "min_tokens": policy.min_tokens}, policy, n)
    if not chosen_mask.any() or not rejected_mask.any():
        return _reject(position, record, "no_loss_tokens", sizes, policy, n)
    return Checked(position, chosen, chosen_mask, n_tokens=n, rejected=(rejected, rejected_mask))


def _reject(position: int, record, reason: str, detail: dict, policy: RecordPolicy, n_tokens: int = -1) -> Checked:
    try:
        cut = excerpt(record.messages, policy.excerpt_chars)
    except Exception:  # noqa: BLE001 - the redactor failed on it: keep no text at all
        cut = excerpt(record.messages, 0)
    return Checked(position, reason=reason, detail=detail, excerpt=cut, n_tokens=n_tokens)


def batch_frame(rows: list[dict], checked: list[Checked], targets: dict[str, float]):
    """The frame the gate validates: one row per record that passed its own checks (gate.COLUMNS)."""
    import pandas as pd

    records = [rows[c.position]["record"] for c in checked]
    domains = [r.domain for r in records]
    if records and records[0].kind == "pair":
        return pd.DataFrame(_pair_columns(rows, checked, records, domains, targets))
    return pd.DataFrame({
        **_record_columns(rows, checked, records, domains),
        "n_tokens": [len(c.ids) for c in checked],
        "loss_tokens": [int(c.mask.sum()) for c in checked],
        "loss_share": [float(c.mask.mean()) for c in checked],
        "truncated": [int(c.truncated) for c in checked],
        "domain_share_dev": share_deviation(domains, targets),
    })


def _record_columns(rows: list[dict], checked: list[Checked], records: list, domains: list[str]) -> dict[str, list]:
    """The columns a chat batch and a pair batch share: where each record came from and what it says."""
    return {
        "record_id": [r.record_id for r in records],
        "source": [r.source for r in records],
        "line": [r.line for r in records],
        "domain": domains,
        "kind": [r.kind for r in records],
        "text_chars": [sum(len(m["content"]) for m in r.messages) for r in records],
        "text_hash": [f"{rows[c.position]['exact']:016x}" for c in checked],
    }


def _pair_columns(rows: list[dict], checked: list[Checked], records: list, domains: list[str],
                  targets: dict[str, float]) -> dict[str, list]:
    """gate.PAIR_COLUMNS: one row per pair; tokens and loss over both of its rows."""
    from mlops.data.pairs import length_ratio, parts, same_after_normalising

    answers = [parts(r)[1:] for r in records]
    tokens = [len(c.ids) + len(c.rejected[0]) for c in checked]
    loss = [int(c.mask.sum()) + int(c.rejected[1].sum()) for c in checked]
    return {
        **_record_columns(rows, checked, records, domains),
        "n_tokens": tokens,
        "loss_tokens": loss,
        "loss_share": [lo / n for lo, n in zip(loss, tokens, strict=True)],
        "truncated": [0] * len(records),
        "domain_share_dev": share_deviation(domains, targets),
        "chosen_chars": [len(chosen) for chosen, _ in answers],
        "rejected_chars": [len(rejected) for _, rejected in answers],
        "length_ratio": [length_ratio(chosen, rejected) for chosen, rejected in answers],
        "identical": [int(same_after_normalising(chosen, rejected)) for chosen, rejected in answers],
    }


def check_batch(task: BatchTask) -> tuple[list[Checked], list[Checked], GateResult | None]:
    """(passed, rejected, suite result) for one batch; no result when no record passed."""
    rows, (suite, params, targets, policy) = task
    results = [check_record(i, row["record"], policy) for i, row in enumerate(rows)]
    passed = [c for c in results if not c.reason]
    rejected = [c for c in results if c.reason]
    if not passed:
        return passed, rejected, None
    return passed, rejected, validate_batch(suite, params, batch_frame(rows, passed, targets))
