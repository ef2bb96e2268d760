"""Cleaning one partition, on a worker: read it, scrub, filter, decontaminate, hash and sign (stage A); then,
once the dedup has decided (mlops.data.lshtasks), write its kept records per domain and its quarantine (stage C).

Everything a partition produces lands in its own folder of the build's work folder (which every worker must
reach: the staging folder, on a filesystem the cluster shares), and what returns to the driver is sums:
counters, length histograms, a bottom-k text sample, the first bad-input issues. So the driver's work and memory
do not grow with the records.

    rows.jsonl      the records that reached dedup, as spill lines (mlops.data.clean.spill_line), in file order
    exact.npy ids.npy after.npy sigs.npy bands.npy
                    per row: normalised-text hash, record id as uint64, (chars, tokens) after cleaning, MinHash
                    signature, and its LSH band hashes (bands x rows, one contiguous row per band)
    rejected.jsonl  quarantine lines of the records a worker step rejected; bad_input.jsonl the rows that are not
                    records
    drops.jsonl     written by the cluster task: [row, reason, duplicate_of, similarity] per dropped row
    semdrops.jsonl  the same for semantic dedup (mlops.data.semtasks, which also writes sem*.npy here)
    ppl-<row>.npy   stage P (data.filters.perplexity on): the rounded perplexity of each row of one range of
                    rows, NaN for rows the dedup dropped (`score_rows`); stage C sets aside the rows outside the
                    driver's bounds
    quarantine.jsonl, kept-<domain hash>.jsonl   stage C's output
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlops.data import clean, perplexity
from mlops.data.fragmentation import TextSample
from mlops.data.lengths import LengthStats
from mlops.data.lsh import band_hashes
from mlops.data.pairs import dedup_text, require_type
from mlops.data.partitions import Partition, read_partition
from mlops.data.quarantine import entry
from mlops.data.records import BadInputError, Record

CHUNK = 128
MAX_ISSUES = 200
DECONTAM_FIELDS = ("record_id", "source", "line", "eval_file", "eval_line", "eval_id", "ngram")


@dataclass
class PartSummary:
    """What a partition reports back to the driver (sums only)."""

    number: int
    rows: int = 0  # records that reached dedup
    counters: Counter = field(default_factory=Counter)
    source: Counter = field(default_factory=Counter)  # records, issues
    issues: list[dict] = field(default_factory=list)
    pii: Counter = field(default_factory=Counter)
    decontam_hits: list[dict] = field(default_factory=list)
    lengths: LengthStats = field(default_factory=LengthStats)
    kept: dict[str, int] = field(default_factory=dict)  # stage C: domain -> records kept
    files: dict[str, str] = field(default_factory=dict)  # stage C: domain -> kept file
    sample: list[tuple[str, str]] = field(default_factory=list)  # stage C: (record id, text) of a bottom-k sample


def _dumps(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n"


class _Arrays:
    def __init__(self) -> None:
        self.exact: list[int] = []
        self.ids: list[int] = []
        self.after: list[tuple[int, int]] = []
        self.sigs: list[np.ndarray] = []

    def save(self, folder: Path, num_perm: int, bands: int, rows: int) -> None:
        np.save(folder / "exact.npy", np.asarray(self.exact, dtype="<u8"))
        np.save(folder / "ids.npy", np.asarray(self.ids, dtype="<u8"))
        np.save(folder / "after.npy", np.asarray(self.after, dtype="<i8").reshape(-1, 2))
        if bands:
            sigs = np.stack(self.sigs).astype("<u4") if self.sigs else np.zeros((0, num_perm), "<u4")
            np.save(folder / "sigs.npy", sigs)
            np.save(folder / "bands.npy", band_hashes(sigs, bands, rows))


def clean_partition(task: dict) -> PartSummary:
    """Stage A for one partition (a worker task): see the module doc for what it writes."""
    cfg = clean._STATE["cfg"]
    part: Partition = task["part"]
    folder = Path(task["dir"])
    folder.mkdir(parents=True, exist_ok=True)
    out = PartSummary(part.number)
    arrays = _Arrays()
    with (folder / "rows.jsonl").open("w", encoding="utf-8") as rows, \
         (folder / "rejected.jsonl").open("w", encoding="utf-8") as rejected, \
         (folder / "bad_input.jsonl").open("w", encoding="utf-8") as bad:
        files = (rows, rejected)
        chunk: list[Record] = []
        for item in read_partition(part):
            if isinstance(item, Record):
                require_type(item, cfg.record_type)  # a chat record among pairs (or back) stops the build
                out.source["records"] += 1
                chunk.append(item)
                if len(chunk) >= CHUNK:
                    _clean_chunk(chunk, cfg, out, arrays, files)
                    chunk = []
                continue
            if cfg.on_bad_record == "fail":
                raise BadInputError(item.message() + " (data.on_bad_record=fail; set it to skip to quarantine bad "
                                    "rows and go on)")
            out.source["issues"] += 1
            out.counters[f"bad_input.{item.code}"] += 1
            row = item.as_dict()
            bad.write(json.dumps(row, ensure_ascii=False) + "\n")
            if len(out.issues) < MAX_ISSUES:  # all of them are in quarantine/bad_input.jsonl
                out.issues.append(row)
        if chunk:
            _clean_chunk(chunk, cfg, out, arrays, files)
    arrays.save(folder, cfg.dedup.num_perm, task["bands"], task["rows"])
    out.rows = len(arrays.exact)
    return out


def _clean_chunk(records: list[Record], cfg: Any, out: PartSummary, arrays: _Arrays, files: tuple) -> None:
    rows, rejected = files
    results, pii = clean.clean_chunk(records)
    out.pii.update(pii)
    for item in results:
        record = item.record
        out.counters["cleaning.seen"] += 1
        out.lengths.add(record.source, record.domain, "before", item.before)
        if item.stage:
            out.counters[f"{item.stage}.{item.reason}"] += 1
            row = entry(record, item.stage, item.reason, item.detail, item.excerpt, cfg.excerpt_chars)
            rejected.write(_dumps(row))
            if item.stage == "decontam":
                out.decontam_hits.append({k: row[k] for k in DECONTAM_FIELDS})
            continue
        rows.write(clean.spill_line(item))
        arrays.exact.append(item.exact)
        arrays.ids.append(int(record.record_id[2:], 16))
        arrays.after.append(tuple(item.after) if item.after else (-1, -1))
        if item.sig is not None:
            arrays.sigs.append(item.sig)


def kept_file(folder: Path, domain: str) -> Path:
    return folder / f"kept-{hashlib.sha256(domain.encode()).hexdigest()[:12]}.jsonl"


def offsets_file(kept: Path) -> Path:
    return kept.with_suffix(".offsets.npy")


def finalize_partition(task: dict) -> PartSummary:
    """Stage C for one partition (a worker task): kept rows to per-domain files; the partition's quarantine
    lines (worker rejections, dedup drops, perplexity outliers) merged in line order."""
    cfg = clean._STATE["cfg"]
    folder = Path(task["dir"])
    out = PartSummary(task["number"])
    drops = dedup_drops(folder)
    after = np.load(folder / "after.npy")
    limits = task.get("perplexity")  # data.filters.perplexity's bounds (the driver's global step), when it ran
    scores = perplexity.read_scores(folder) if limits else None
    sample = TextSample()
    dedup_lines: list[tuple[int, str]] = []
    handles: dict[str, Any] = {}
    offsets: dict[str, list[int]] = {}  # byte offset of each kept line, and the file's end: batch tasks seek
    try:
        for index, (line, row) in enumerate(zip(_lines(folder / "rows.jsonl"), clean.read_spill(folder / "rows.jsonl"),
                                                strict=True)):
            record = row["record"]
            drop = drops.get(index)
            if drop is not None:
                reason, earlier, sim = drop
                detail = {"duplicate_of": earlier} if sim is None else {"duplicate_of": earlier, "similarity": sim}
                out.counters[f"dedup.{reason}"] += 1
                dedup_lines.append((record.line, _dumps(entry(record, "dedup", reason, detail,
                                                              limit=cfg.excerpt_chars))))
                continue
            outlier = perplexity.judge(float(scores[index]), limits) if limits else None
            if outlier is not None:  # in row order too, so these lines stay sorted with the dedup ones
                reason, detail = outlier
                out.counters[f"filter.{reason}"] += 1
                dedup_lines.append((record.line, _dumps(entry(record, "filter", reason, detail,
                                                              limit=cfg.excerpt_chars))))
                continue
            out.counters["cleaning.kept"] += 1
            out.lengths.add(record.source, record.domain, "after", tuple(after[index].tolist()))
            sample.offer(record.record_id, record.text)
            if record.domain not in handles:
                path = kept_file(folder, record.domain)
                out.files[record.domain] = str(path)
                handles[record.domain] = path.open("wb")
                offsets[record.domain] = [0]
            raw = line.encode("utf-8")
            handles[record.domain].write(raw)
            offsets[record.domain].append(offsets[record.domain][-1] + len(raw))
            out.kept[record.domain] = out.kept.get(record.domain, 0) + 1
    finally:
        for fh in handles.values():
            fh.close()
    for domain, ends in offsets.items():
        np.save(offsets_file(Path(out.files[domain])), np.asarray(ends, dtype=np.int64))
    worker_lines = [(json.loads(text)["line"], text) for text in _lines(folder / "rejected.jsonl")]
    with (folder / "quarantine.jsonl").open("w", encoding="utf-8") as fh:
        fh.writelines(text for _, text in heapq.merge(worker_lines, dedup_lines, key=lambda pair: pair[0]))
    out.sample = [(rid, text) for _, rid, text in sample._heap]  # merged into the build's sample by the driver
    return out


def _lines(path: Path):
    with path.open(encoding="utf-8") as fh:
        yield from fh


def dedup_drops(folder: Path) -> dict[int, tuple[str, str, float | None]]:
    """Row -> (reason, kept record, similarity) of every dedup drop in a partition: exact and MinHash (drops.jsonl,
    the cluster task's) and semantic (semdrops.jsonl: data.dedup.semantic's, among the rows drops.jsonl kept)."""
    return {**_read_drops(folder / "drops.jsonl"), **_read_drops(folder / "semdrops.jsonl")}


def score_rows(task: dict) -> Counter:
    """Stage P for rows [start, stop) of a partition (a worker task, data.filters.perplexity): score those the
    dedup kept, write their scores (NaN for the rest) and return the exact histogram of the scores. The ranges
    are fixed by row counts alone, so a row is batched with the same rows whoever runs it."""
    folder, start, stop = Path(task["dir"]), task["start"], task["stop"]
    drops = dedup_drops(folder)
    rows, texts = [], []
    with (folder / "rows.jsonl").open(encoding="utf-8") as fh:
        for index, line in enumerate(itertools.islice(fh, start, stop), start):
            if index not in drops:
                rows.append(index - start)
                texts.append(dedup_text(clean.parse_spill(line)["record"]))  # a pair: its prompt and chosen side
    scores = np.full(stop - start, np.nan)
    if texts:
        model = perplexity.scorer(task["model"], task["device"])
        scores[rows] = model.score(texts, task["batch_size"], task["max_tokens"])
    np.save(perplexity.scores_file(folder, start), scores)
    return Counter(s for s in scores.tolist() if not np.isnan(s))


def _read_drops(path: Path) -> dict[int, tuple[str, str, float | None]]:
    if not path.exists():
        return {}
    out = {}
    for text in _lines(path):
        index, reason, earlier, sim = json.loads(text)
        out[index] = (reason, earlier, sim)
    return out
