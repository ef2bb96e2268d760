"""The cleaning stage of a build, with every per-record step on the workers; this process only plans and sums.

    A  one task per partition (mlops.data.partitions): read, scrub, filter, decontaminate, exact hash, MinHash,
       band hashes (mlops.data.partclean.clean_partition)
    B  one task per (band, hash range), plus the exact "band": sort, bucket, confirm -> edges; then one task joins
       the edges into clusters and writes each partition's drops (mlops.data.lshtasks)
    B2 with data.dedup.semantic on: embed per partition, k-means rounds, compare per cluster range, name the
       drops (mlops.data.semtasks)
    P  with data.filters.perplexity on: one task per range of a partition's rows scores those the dedup kept and
       returns a histogram; this process takes the bounds from their sum (mlops.data.perplexity)
    C  one task per partition: kept rows per domain, quarantine lines (mlops.data.partclean.finalize_partition)

Each stage maps its tasks in order with the build's pool (local processes or Ray, the same code), so what this
process holds and does is per partition or per band, never per record, apart from copying the partitions'
quarantine files into the snapshot's. Earlier snapshots (dedup.load_prior's index) take part as the first keys,
so a record is still dropped as a duplicate of a record another build kept.
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlops.data import perplexity
from mlops.data.dedup import check_prior
from mlops.data.fragmentation import TextSample
from mlops.data.lengths import LengthStats
from mlops.data.lsh import lsh_params
from mlops.data.lshtasks import band_task, cluster_task, partition_segment, plan_dedup, prior_segment
from mlops.data.partclean import MAX_ISSUES, clean_partition, finalize_partition, score_rows
from mlops.data.partitions import plan_partitions


@dataclass
class CleanSummary:
    """What the manifest and the acceptance report read of the cleaning (the old in-process Cleaner's sums)."""

    counters: Counter = field(default_factory=Counter)
    pii: Counter = field(default_factory=Counter)
    decontam_hits: list[dict] = field(default_factory=list)
    lengths: LengthStats = field(default_factory=LengthStats)
    sample: TextSample = field(default_factory=TextSample)
    semantic: dict | None = None  # data.dedup.semantic's figures (mlops.data.semtasks), when it ran
    perplexity: dict | None = None  # data.filters.perplexity's distribution and bounds, when it ran


def run_cleaning(build: Any, pool: Any) -> tuple[CleanSummary, dict[str, int], dict[str, list[tuple[Path, int]]]]:
    """(sums, kept records per domain, (kept file, records) per domain in record order) of `build`'s sources."""
    data, work = build.data, build.work / "parts"
    dedup = data.dedup
    bands, rows = lsh_params(dedup.threshold, dedup.num_perm) if dedup.near else (0, 0)
    tasks = [{"part": p, "dir": str(work / f"{p.number:05d}"), "bands": bands, "rows": rows}
             for p in plan_partitions(build.inputs.sources)]
    summary = CleanSummary()
    parts = list(pool.map(clean_partition, tasks))  # stage A
    for task, part in zip(tasks, parts, strict=True):
        stats = build.per_source[task["part"].source["name"]]
        stats.update(part.source)
        build.issues += part.issues[: MAX_ISSUES - len(build.issues)]
        summary.counters.update(part.counters)
        summary.pii.update(part.pii)
        summary.decontam_hits += part.decontam_hits
        summary.lengths.update(part.lengths)
    _copy(work, tasks, "bad_input.jsonl", build.quarantine._bad)

    segments, first_new = _segments(build, tasks, parts, bands > 0)  # stage B
    if dedup.exact or dedup.near:
        planned = plan_dedup(segments, work, dedup.exact, dedup.near, bands, rows, dedup.threshold)
        tried = sum(pool.map(band_task, planned))
        summary.counters["dedup.near_candidates"] = tried
        list(pool.map(cluster_task, [{"segments": segments, "edges": [t["out"] for t in planned],
                                      "first_new": first_new, "exact": dedup.exact}]))
    if dedup.semantic.enabled:  # stage B2: paraphrases among what exact and MinHash dedup kept
        from mlops.data.semtasks import run_semantic

        summary.semantic = run_semantic(pool, dedup.semantic, segments, first_new, work, build.inputs.seed)

    limits = _perplexity(build, pool, tasks, parts, summary) if data.filters.perplexity.enabled else None  # stage P

    available: Counter[str] = Counter()  # stage C
    paths: dict[str, list[tuple[Path, int]]] = {}
    for done in pool.map(finalize_partition, [{"dir": t["dir"], "number": t["part"].number, "perplexity": limits}
                                              for t in tasks]):
        summary.counters.update(done.counters)
        summary.lengths.update(done.lengths)
        for rid, text in done.sample:
            summary.sample.offer(rid, text)
        available.update(done.kept)
        for domain, path in done.files.items():
            paths.setdefault(domain, []).append((Path(path), done.kept[domain]))
    _copy(work, tasks, "quarantine.jsonl", build.quarantine._records)
    return summary, dict(sorted(available.items())), paths


def _perplexity(build: Any, pool: Any, tasks: list[dict], parts: list, summary: CleanSummary) -> dict:
    """Stage P and its global step: the bounds from the whole snapshot's scores (the sum of the ranges' exact
    histograms), the same whichever executor and worker count scored them. Ranges of perplexity.SCORE_ROWS rows,
    not whole partitions, so one large source file does not leave the other workers idle."""
    cfg, model = build.data.filters.perplexity, build.inputs.extra["perplexity_model"]
    spec = {"model": model["path"], "device": cfg.device, "batch_size": cfg.batch_size, "max_tokens": cfg.max_tokens}
    ranges = [{"dir": t["dir"], "start": start, "stop": min(start + perplexity.SCORE_ROWS, part.rows), **spec}
              for t, part in zip(tasks, parts, strict=True) for start in range(0, part.rows, perplexity.SCORE_ROWS)]
    hist: Counter[float] = Counter()
    for scores in pool.map(score_rows, ranges):
        hist.update(scores)
    perplexity.release()  # the inline pool (data.workers=1) scored in this process
    limits = perplexity.bounds(hist, cfg)
    summary.perplexity = perplexity.report(hist, limits, model, cfg)
    return limits


def _segments(build: Any, tasks: list[dict], parts: list, near: bool) -> tuple[list, int]:
    params = build.dedup_params()
    segments, base = [], 0
    for sid, folder in build.inputs.priors:
        check_prior(folder, sid, params, near)
        seg = prior_segment(base, sid, folder, near)
        build.counters[f"dedup.prior_records.{sid}"] = seg.count
        segments.append(seg)
        base += seg.count
    first_new = base
    for task, part in zip(tasks, parts, strict=True):
        if part.rows:
            segments.append(partition_segment(base, part.rows, Path(task["dir"]), near))
            base += part.rows
    return segments, first_new


def _copy(work: Path, tasks: list[dict], name: str, target: Any) -> None:
    """Append each partition's file to the snapshot's (Quarantine's open file), in partition order: bytes only."""
    target.flush()
    for task in tasks:
        path = Path(task["dir"]) / name
        if path.exists():
            with path.open(encoding="utf-8") as fh:
                shutil.copyfileobj(fh, target)
