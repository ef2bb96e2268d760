"""Cleaning: PII scrub, quality filters and decontamination per record (in worker processes), then exact
and near dedup in record order (in the main process, which owns the indexes).

A record over `filters.max_chars` is rejected before it is scrubbed (scrubbing 50 MB buys nothing). Every
rejection becomes a counter `<stage>.<reason>` and a quarantine line with the reason and a redacted excerpt,
made in the worker for worker-side rejections; a near-duplicate drop names the kept record and the
estimated similarity.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlops.data import pairs
from mlops.data.config import DataConfig
from mlops.data.decontam import EvalIndex
from mlops.data.dedup import ExactIndex, NearIndex, exact_hash, signature
from mlops.data.filters import run_filters
from mlops.data.fragmentation import TextSample
from mlops.data.lengths import LengthStats, measure
from mlops.data.pii import Scrubber, redact
from mlops.data.quarantine import Quarantine, excerpt
from mlops.data.records import Record

_STATE: dict = {}


@dataclass
class Cleaned:
    record: Record
    stage: str = ""  # "" = kept so far; else filter | decontam | dedup | error
    reason: str = ""
    detail: dict = field(default_factory=dict)
    exact: int = 0
    sig: np.ndarray | None = None
    excerpt: list[dict] | None = None  # redacted, for a rejection decided in the worker
    before: tuple[int, int] | None = None  # (characters, content tokens) as read (mlops.data.lengths)
    after: tuple[int, int] | None = None  # the same after scrubbing, for a record the filters kept


def _reject(record: Record, stage: str, reason: str, limit: int, detail: dict | None = None) -> Cleaned:
    """The rejection travels back without the record's text: the redacted excerpt is all that is kept."""
    cut = excerpt(record.messages, limit)
    record.messages = []
    return Cleaned(record, stage, reason, detail or {}, excerpt=cut)


def init_worker(cfg_json: str, eval_index: EvalIndex, blocklist=None) -> None:
    from mlops.data.blocklist import install

    install(blocklist)
    cfg = DataConfig.model_validate_json(cfg_json)
    _STATE.update(cfg=cfg, index=eval_index, scrubber=Scrubber(cfg.pii.types if cfg.pii.enabled else []))


def clean_chunk(records: list[Record]) -> tuple[list[Cleaned], dict[str, int]]:
    """Stateless steps for a chunk of records; returns the results and the PII counts of this chunk."""
    cfg: DataConfig = _STATE["cfg"]
    scrubber: Scrubber = _STATE["scrubber"]
    index: EvalIndex = _STATE["index"]
    scrubber.counts.clear()
    raw = [record.text for record in records]
    before = measure(raw)
    out = []
    for record in records:
        try:
            out.append(_clean_one(record, cfg, scrubber, index))
        except Exception as err:  # noqa: BLE001 - a record the steps cannot handle costs itself, not the build
            try:
                out.append(_reject(record, "error", type(err).__name__, cfg.excerpt_chars))
            except Exception:  # noqa: BLE001 - the redactor itself failed on it: keep no text at all
                out.append(_reject(record, "error", type(err).__name__, 0))
    _measure_after(out, raw, before)
    return out, dict(scrubber.counts)


def _measure_after(out: list[Cleaned], raw: list[str], before: list[tuple[int, int]]) -> None:
    """Length figures for the acceptance report; a record scrubbing left unchanged is not tokenized twice."""
    changed = []
    for item, text, figures in zip(out, raw, before, strict=True):
        item.before = figures
        if item.stage:
            continue
        if item.record.text == text:
            item.after = figures
        else:
            changed.append(item)
    for item, figures in zip(changed, measure([c.record.text for c in changed]), strict=True):
        item.after = figures


def _clean_one(record: Record, cfg: DataConfig, scrubber: Scrubber, index: EvalIndex) -> Cleaned:
    limit = cfg.excerpt_chars
    if "length" in cfg.filters.steps and pairs.side_chars(record) > cfg.filters.max_chars:
        return _reject(record, "filter", "too_long", limit)
    for message in record.messages:
        message["content"] = scrubber.scrub(message["content"])
    text = pairs.dedup_text(record)  # a pair is deduplicated on its prompt and chosen answer
    ok, reason = pairs.filter_pair(record, cfg.filters) if pairs.is_pair(record) else run_filters(record, cfg.filters)
    if not ok:
        return _reject(record, "filter", reason, limit)
    hit = index.find(m["content"] for m in record.messages)  # per message, as the eval report reads it
    if hit is not None:
        ref, gram = hit
        # The shared n-gram is the record's text too: it leaves the worker redacted, like any excerpt.
        return _reject(record, "decontam", "eval_overlap", limit, {**ref, "ngram": redact(gram, 200)})
    sig = signature(text, cfg.dedup.num_perm, cfg.dedup.shingle) if cfg.dedup.near else None
    return Cleaned(record, exact=exact_hash(text), sig=sig)


def encode_sig(sig: np.ndarray | None) -> str | None:
    return None if sig is None else base64.b64encode(sig.astype("<u4").tobytes()).decode()


def decode_sig(text: str | None) -> np.ndarray | None:
    return None if text is None else np.frombuffer(base64.b64decode(text), dtype="<u4").copy()


class Cleaner:
    """Owns the dedup indexes and the quarantine file; consumes worker results in record order."""

    def __init__(self, cfg: DataConfig, quarantine: Quarantine, exact: ExactIndex, near: NearIndex | None) -> None:
        self.cfg = cfg
        self.quarantine = quarantine
        self.exact = exact
        self.near = near
        self.counters: Counter[str] = Counter()
        self.pii: Counter[str] = Counter()
        self.decontam_hits: list[dict] = []
        self.lengths = LengthStats()
        self.sample = TextSample()

    def reject(self, item: Cleaned) -> None:
        self.counters[f"{item.stage}.{item.reason}"] += 1
        entry = self.quarantine.record(item.record, item.stage, item.reason, item.detail, item.excerpt)
        if item.stage == "decontam":
            self.decontam_hits.append({k: entry[k] for k in ("record_id", "source", "line", "eval_file",
                                                              "eval_line", "eval_id", "ngram")})

    def dedup(self, item: Cleaned) -> Cleaned:
        key = item.record.record_id
        if self.cfg.dedup.exact:
            earlier = self.exact.check_add(item.exact, key)
            if earlier is not None:
                prior = "#" in earlier
                item.stage, item.reason = "dedup", "exact_of_snapshot" if prior else "exact"
                item.detail = {"duplicate_of": earlier}
                return item
        else:
            self.exact.check_add(item.exact, key)
        if self.near is not None and item.sig is not None:
            match = self.near.check_add(item.sig, key)
            if match is not None:
                earlier, sim = match
                item.stage, item.reason = "dedup", "near_of_snapshot" if "#" in earlier else "near"
                item.detail = {"duplicate_of": earlier, "similarity": round(sim, 4)}
        return item

    def consume(self, results: Iterable[tuple[list[Cleaned], dict[str, int]]]) -> Iterator[Cleaned]:
        for chunk, pii in results:
            self.pii.update(pii)
            for item in chunk:
                self.counters["cleaning.seen"] += 1
                record = item.record
                self.lengths.add(record.source, record.domain, "before", item.before)
                if not item.stage:
                    item = self.dedup(item)
                if item.stage:
                    self.reject(item)
                    continue
                self.counters["cleaning.kept"] += 1
                self.lengths.add(record.source, record.domain, "after", item.after)
                self.sample.offer(record.record_id, record.text)
                yield item


def spill_line(item: Cleaned) -> str:
    r = item.record
    row = {"record_id": r.record_id, "source": r.source, "line": r.line, "domain": r.domain, "kind": r.kind,
           "messages": r.messages, "exact": item.exact, "sig": encode_sig(item.sig)}
    if r.provenance:  # pairs only: chat spill lines stay as they were
        row["provenance"] = r.provenance
    return json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n"


def read_spill(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            yield parse_spill(line)


def parse_spill(line: str | bytes) -> dict:
    """One spill line back to {"record", "exact", "sig"}."""
    row = json.loads(line)
    row["record"] = Record(row.pop("record_id"), row.pop("source"), row.pop("line"), row.pop("domain"),
                           row.pop("kind"), row.pop("messages"), row.pop("provenance", None))
    row["sig"] = decode_sig(row["sig"])
    return row
