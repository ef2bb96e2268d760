"""Semantic dedup (SemDeDup, as NeMo Curator runs it): embed the records exact and MinHash dedup kept, cluster the
embeddings with k-means, and inside each cluster drop the records that paraphrase a kept one.

The keep rule: inside a cluster, records are taken in build order (their key: earlier sources first, then earlier
lines; the same order that exact and MinHash dedup keep the first of). A record is dropped when its cosine
similarity to a record already kept in its cluster reaches the threshold, and it names the most similar such
record (the earliest on a tie); otherwise it is kept. So each group (a kept record and the records that name it)
keeps exactly one record, its earliest, and every drop is at least `threshold` from the record it names (no chain
of small steps drifts from one question to another, as a transitive cluster could).

Pairs are compared within a k-means cluster only: that is what makes it scale (cost ~ sum of squared cluster sizes
instead of n^2), and what it misses is a paraphrase pair split across two clusters (benchmarks/bench_semdedup.py
measures the recall this costs).

Everything here works on quantised embeddings (mlops.data.embed.quantise: int16 at 1e-4 steps). Their dot products
and the k-means sums are integers that float64 holds exactly, so an assignment, a centroid, a similarity and a
decision are exact functions of the quantised vectors: the same on any machine, BLAS, thread count or partitioning.
k-means starts from `k` records drawn with a seeded generator by their index in build order, assigns each vector to
its nearest centroid (lowest index on a tie), moves each centroid to its members' mean rounded to the same integer
grid (an empty cluster keeps its centroid) and stops when no assignment changes or after `iterations` rounds.

The build runs these steps as worker tasks (mlops.data.semtasks); `semantic_dedup_texts` runs them in one process
for a list of texts (benchmarks, tests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

INIT_STREAM = 0x5E4  # the k-means init's own random stream under the build seed
ASSIGN_BLOCK = 4096  # vectors assigned at a time (bounds the distance matrix)
KEEP_BLOCK = 512  # cluster members compared at a time against the kept ones


def auto_clusters(n: int, clusters: int | str = "auto") -> int:
    """k: ceil(sqrt(n)) for auto (balances the k-means cost n*k against the in-cluster cost ~n^2/k), never above n."""
    k = math.ceil(math.sqrt(n)) if clusters == "auto" else int(clusters)
    return max(1, min(k, n))


def init_picks(n: int, k: int, seed: int) -> np.ndarray:
    """Indices (in build order) of the k records whose embeddings start k-means."""
    rng = np.random.default_rng([seed, INIT_STREAM])
    return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)


def assign(q: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid of each quantised vector (int32 labels; the lowest index on a tie). Exact: |c|^2 - 2 q.c
    over integers below 2**53 in float64."""
    c = np.asarray(centroids, dtype=np.float64)
    c2 = np.einsum("ij,ij->i", c, c)
    labels = np.empty(len(q), dtype=np.int32)
    for start in range(0, len(q), ASSIGN_BLOCK):
        block = np.asarray(q[start : start + ASSIGN_BLOCK], dtype=np.float64)
        labels[start : start + len(block)] = np.argmin(c2[None, :] - 2.0 * (block @ c.T), axis=1)
    return labels


def partial_sums(q: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(k, dim) int64 sums and (k,) counts of the vectors per label: summed over partitions in any order, exactly."""
    sums = np.zeros((k, q.shape[1]), dtype=np.int64)
    np.add.at(sums, labels, np.asarray(q, dtype=np.int64))
    return sums, np.bincount(labels, minlength=k).astype(np.int64)


def update(sums: np.ndarray, counts: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """Each centroid moves to its members' mean, rounded half up on the integer grid; an empty one stays."""
    n = np.maximum(counts, 1)[:, None]
    mean = np.floor_divide(2 * sums + n, 2 * n)  # exact integer rounding, no float division
    return np.where(counts[:, None] > 0, mean, previous).astype(np.int64)


def kmeans(q: np.ndarray, k: int, seed: int, iterations: int) -> tuple[np.ndarray, int]:
    """(labels, rounds run) in one process: the build's distributed k-means (mlops.data.semtasks) gives the same."""
    centroids = np.asarray(q[init_picks(len(q), k, seed)], dtype=np.int64)
    labels = None
    for round_ in range(1, iterations + 1):
        new = assign(q, centroids)
        if labels is not None and np.array_equal(new, labels):
            return new, round_
        labels = new
        if round_ < iterations:
            centroids = update(*partial_sums(q, labels, k), centroids)
    return labels, iterations


def norms(q: np.ndarray) -> np.ndarray:
    v = np.asarray(q, dtype=np.float64)
    return np.sqrt(np.einsum("ij,ij->i", v, v))


@dataclass
class Drop:
    member: int  # position in the cluster's input
    kept: int  # position of the kept record it names
    similarity: float  # cosine, rounded to 4 decimals


def cluster_drops(keys: np.ndarray, q: np.ndarray, threshold: float) -> tuple[list[Drop], int]:
    """The keep rule (module doc) on one cluster: (drops, pairs compared). Members are walked in key order in
    blocks, each block compared with the records kept before it and among itself."""
    order = np.argsort(keys, kind="stable")
    vecs = np.asarray(q, dtype=np.float64)[order]
    lengths = norms(q)[order]
    lengths[lengths == 0] = 1.0
    kept: list[int] = []  # sorted positions (in `order`) of kept members
    drops: list[Drop] = []
    compared = 0
    for start in range(0, len(order), KEEP_BLOCK):
        block = vecs[start : start + KEEP_BLOCK]
        before = np.asarray(kept, dtype=np.int64)
        cos_kept = (block @ vecs[before].T) / (lengths[start : start + len(block), None] * lengths[None, before])
        cos_self = (block @ block.T) / (lengths[start : start + len(block), None] *
                                        lengths[None, start : start + len(block)])
        inside: list[int] = []  # kept members of this block, by offset
        for j in range(len(block)):
            sims = np.concatenate((cos_kept[j], cos_self[j, inside])) if inside else cos_kept[j]
            compared += len(sims)
            best = int(np.argmax(sims)) if len(sims) else -1
            if best >= 0 and sims[best] >= threshold:
                other = int(before[best]) if best < len(before) else start + inside[best - len(before)]
                drops.append(Drop(int(order[start + j]), int(order[other]), round(float(sims[best]), 4)))
            else:
                inside.append(j)
        kept += [start + j for j in inside]
    return drops, compared


def drops_by_cluster(keys: np.ndarray, q: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[list, int]:
    """[(key dropped, key kept, similarity)] over every cluster in `labels`, sorted by dropped key; pairs compared."""
    out: list[tuple[int, int, float]] = []
    compared = 0
    order = np.argsort(labels, kind="stable")
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    for members in np.split(order, bounds) if len(order) else []:
        if len(members) < 2:
            continue
        found, n = cluster_drops(keys[members], q[members], threshold)
        compared += n
        out += [(int(keys[members[d.member]]), int(keys[members[d.kept]]), d.similarity) for d in found]
    return sorted(out), compared


@dataclass
class SemDecision:
    index: int
    kept: bool
    duplicate_of: int = -1  # index of the kept text it paraphrases
    similarity: float = 1.0
    cluster: int = -1


def semantic_dedup_texts(texts: Sequence[str], *, threshold: float = 0.85, clusters: int | str = "auto",
                         seed: int = 1234, batch_size: int = 64, max_tokens: int = 256, iterations: int = 20,
                         model: str = "all-MiniLM-L6-v2", vectors: np.ndarray | None = None) -> list[SemDecision]:
    """Semantic dedup of a list of texts in one process (index order is build order); one decision per text.
    `vectors` (quantised embeddings) skips the embedding, for callers that embed once and try settings."""
    if not texts:
        return []
    if vectors is None:
        from mlops.data.embed import embedder, quantise

        vectors = quantise(embedder(model, max_tokens).embed(list(texts), batch_size))
    keys = np.arange(len(texts), dtype=np.int64)
    labels, _ = kmeans(vectors, auto_clusters(len(texts), clusters), seed, iterations)
    out = [SemDecision(i, True, cluster=int(labels[i])) for i in range(len(texts))]
    for dropped, kept, sim in drops_by_cluster(keys, vectors, labels, threshold)[0]:
        out[dropped] = SemDecision(dropped, False, kept, sim, int(labels[dropped]))
    return out
