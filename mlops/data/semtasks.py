"""Semantic dedup of a build as worker tasks, between the MinHash clustering (stage B) and the kept files (stage C).

    embed     one task per partition: the rows exact and MinHash dedup kept, embedded in batches and quantised
              -> sem.npy (int16 vectors), sem_rows.npy (their row numbers)
    k-means   one task draws the seeded starting centroids; then each round maps one task per partition (assign to
              the nearest centroid -> sem_labels-<round>.npy; return the per-cluster integer sums and counts), and
              this process adds the sums and writes the next centroids (k x dim integers: never a record)
    compare   one task per range of clusters (cluster % shards): the keep rule of mlops.data.semdedup inside each
              cluster -> sem-drops-<shard>.npy
    name      one task turns the drops into each partition's semdrops.jsonl ([row, "semantic", kept record id,
              similarity]), which stage C reads beside drops.jsonl

Keys are the build's (mlops.data.lshtasks: earlier snapshots first, then partitions in order, rows in order), so the
keep rule's "earliest" is the same record on every executor. Partitions follow from the sources alone and each
task's output is a function of its inputs, so a retried task rewrites the same bytes; the sums are integers, so
their order does not matter. Earlier snapshots take no part: they store no embeddings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from mlops.data import semdedup
from mlops.data.embed import release
from mlops.data.lsh import SHARD_RECORDS
from mlops.data.lshtasks import Segment, Store
from mlops.data.pairs import dedup_text

VECTORS, ROWS = "sem.npy", "sem_rows.npy"


def labels_file(folder: str, round_: int) -> Path:
    return Path(folder) / f"sem_labels-{round_:03d}.npy"


def _dropped_rows(folder: Path) -> set[int]:
    path = folder / "drops.jsonl"
    if not path.exists():
        return set()
    with path.open(encoding="utf-8") as fh:
        return {json.loads(line)[0] for line in fh}


def embed_task(task: dict) -> int:
    """Embed one partition's rows that survived exact and MinHash dedup; returns how many."""
    from mlops.data.clean import read_spill
    from mlops.data.embed import MODELS, embedder, quantise

    folder = Path(task["dir"])
    dropped = _dropped_rows(folder)
    rows, texts = [], []
    for index, row in enumerate(read_spill(folder / "rows.jsonl")):
        if index not in dropped:
            rows.append(index)
            texts.append(dedup_text(row["record"]))  # a pair: its prompt and chosen answer, as every dedup sees it
    if texts:
        vectors = quantise(embedder(task["model"], task["max_tokens"]).embed(texts, task["batch_size"]))
    else:
        vectors = np.zeros((0, MODELS[task["model"]].dim), dtype=np.int16)
    np.save(folder / VECTORS, vectors)
    np.save(folder / ROWS, np.asarray(rows, dtype=np.int64))
    return len(rows)


def gather_task(task: dict) -> None:
    """The starting centroids: the vectors at `picks` (indices over the partitions' kept rows, in order)."""
    picks, out, offset = np.asarray(task["picks"], dtype=np.int64), [], 0
    for folder, count in task["parts"]:
        mine = picks[(picks >= offset) & (picks < offset + count)] - offset
        if len(mine):
            out.append(np.asarray(np.load(Path(folder) / VECTORS, mmap_mode="r")[mine], dtype=np.int64))
        offset += count
    np.save(task["out"], np.concatenate(out))


def assign_task(task: dict) -> tuple[np.ndarray, np.ndarray, int]:
    """One k-means round on one partition: (sums, counts, labels changed since the last round)."""
    q = np.load(Path(task["dir"]) / VECTORS)
    labels = semdedup.assign(q, np.load(task["centroids"]))
    np.save(labels_file(task["dir"], task["round"]), labels)
    if task["round"] > 1:
        changed = int(np.count_nonzero(labels != np.load(labels_file(task["dir"], task["round"] - 1))))
    else:
        changed = len(labels)
    return (*semdedup.partial_sums(q, labels, task["k"]), changed)


def compare_task(task: dict) -> tuple[int, int]:
    """The keep rule inside the clusters of one shard -> <out>.npy of (dropped key, kept key, similarity * 1e4);
    returns (drops, pairs compared)."""
    keys, vectors, labels = [], [], []
    for folder, base in task["parts"]:
        own = np.load(labels_file(folder, task["round"]))
        mine = np.flatnonzero(own % task["shards"] == task["shard"])
        if len(mine):
            keys.append(base + np.load(Path(folder) / ROWS)[mine])
            vectors.append(np.asarray(np.load(Path(folder) / VECTORS, mmap_mode="r")[mine]))
            labels.append(own[mine])
    if keys:
        found, compared = semdedup.drops_by_cluster(np.concatenate(keys), np.concatenate(vectors),
                                                    np.concatenate(labels), task["threshold"])
    else:
        found, compared = [], 0
    table = np.asarray([(d, k, round(s * 10_000)) for d, k, s in found], dtype=np.int64).reshape(-1, 3)
    np.save(task["out"], table)
    return len(found), compared


def name_task(task: dict) -> int:
    """Every shard's drops -> semdrops.jsonl in each partition folder, naming the kept record; returns the drops."""
    table = np.concatenate([np.load(path) for path in task["drops"]]) if task["drops"] else np.zeros((0, 3), np.int64)
    table = table[np.argsort(table[:, 0], kind="stable")]
    store = Store(task["segments"])
    out, folder = None, None
    try:  # keys in order are partitions in order: each file is written start to end, then closed
        for key, kept, sim in table.tolist():
            seg, row = store.locate(key)
            if seg.folder != folder:
                if out is not None:
                    out.close()
                folder = seg.folder
                out = (Path(folder) / "semdrops.jsonl").open("w", encoding="utf-8")
            out.write(json.dumps([row, "semantic", store.name(kept), sim / 10_000]) + "\n")
    finally:
        if out is not None:
            out.close()
        store.close()
    return len(table)


def run_semantic(pool: Any, cfg: Any, segments: list[Segment], first_new: int, work: Path, seed: int) -> dict:
    """The semantic dedup of a build's partitions (module doc); returns the manifest's figures. This process plans
    the tasks and adds up k x dim integer sums; it never reads a record."""
    parts = [s for s in segments if s.base >= first_new and s.count]
    embed = [{"dir": s.folder, "model": cfg.model, "max_tokens": cfg.max_tokens, "batch_size": cfg.batch_size}
             for s in parts]
    counts = list(pool.map(embed_task, embed))
    release()  # the inline pool (data.workers=1) embedded in this process
    parts = [(s, n) for s, n in zip(parts, counts, strict=True) if n]
    total = sum(counts)
    figures = {"model": cfg.model, "threshold": cfg.threshold, "records": total, "clusters": 0, "rounds": 0,
               "compared_pairs": 0, "dropped": 0}
    if total < 2:
        return figures
    k = semdedup.auto_clusters(total, cfg.clusters)
    folder = work / "semantic"
    folder.mkdir(parents=True, exist_ok=True)
    centroids = folder / "centroids-001.npy"
    list(pool.map(gather_task, [{"parts": [(s.folder, n) for s, n in parts], "out": str(centroids),
                                 "picks": semdedup.init_picks(total, k, seed).tolist()}]))
    current = np.load(centroids)
    for round_ in range(1, cfg.iterations + 1):
        tasks = [{"dir": s.folder, "centroids": str(centroids), "round": round_, "k": k} for s, _ in parts]
        sums, sizes, changed = np.zeros_like(current), np.zeros(k, np.int64), 0
        for part_sums, part_sizes, part_changed in pool.map(assign_task, tasks):
            sums += part_sums
            sizes += part_sizes
            changed += part_changed
        if round_ > 1 and changed == 0:
            break
        if round_ < cfg.iterations:
            current = semdedup.update(sums, sizes, current)
            centroids = folder / f"centroids-{round_ + 1:03d}.npy"
            np.save(centroids, current)
    shards = max(1, math.ceil(total / SHARD_RECORDS))
    compare = [{"parts": [(s.folder, s.base) for s, _ in parts], "round": round_, "shards": shards, "shard": i,
                "threshold": cfg.threshold, "out": str(folder / f"sem-drops-{i:04d}.npy")} for i in range(shards)]
    done = list(pool.map(compare_task, compare))
    dropped = list(pool.map(name_task, [{"segments": segments, "drops": [t["out"] for t in compare]}]))[0]
    figures.update(clusters=k, rounds=round_, compared_pairs=sum(c for _, c in done), dropped=dropped)
    return figures
