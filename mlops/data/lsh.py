"""Exact and MinHash LSH dedup as a sort per band, then connected components: no index in one process.

Every record that reaches dedup has an int key, its position in the build (records of earlier snapshots come
first, then sources in order, lines in order). The LSH is sharded by band (and by hash range within a band, so a
task's memory is bounded by `SHARD_RECORDS`): a band task sorts its (band hash, key) pairs, and within each bucket
confirms each member against the earlier members by estimated Jaccard similarity (the share of equal signature
rows) until one reaches the threshold: that is an edge. Exact dedup is one more "band", the 64-bit hash of the
normalised text, whose buckets need no confirmation. The edges of every band form connected components; each
component keeps its smallest key and drops the rest, naming the kept record. So the result depends on the
records and their order only, never on how they were cut into partitions or how many workers ran.

As in datatrove's and NeMo Curator's fuzzy dedup, a record similar to a dropped record is dropped too (the
cluster is transitive), where a greedy index would keep it when it is not similar to the kept one.

`dedup_texts` runs the same steps in one process for a list of texts: the stable entry point for comparisons.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

SHARD_RECORDS = 250_000  # keys per band task (16 bytes each, a few MB with the sort), whatever the input size
MAX_CONFIRM = 64  # earlier bucket members a record is confirmed against (bounds a huge bucket's cost)
_MIX = np.uint64(0xFF51AFD7ED558CCD)


@cache
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band): datasketch MinHashLSH's choice for this threshold, as the earlier index used."""
    from datasketch import MinHashLSH

    probe = MinHashLSH(threshold=threshold, num_perm=num_perm)
    return probe.b, probe.r


def band_hash(sigs: np.ndarray, band: int, rows: int) -> np.ndarray:
    """64-bit hash of one band of each signature row (vectorised; a collision only costs a confirmation)."""
    block = np.asarray(sigs[:, band * rows : (band + 1) * rows], dtype=np.uint64)
    h = np.full(len(block), np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(band), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(rows):
            h ^= block[:, j]
            h *= _MIX
            h ^= h >> np.uint64(33)
    return h


def band_hashes(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(bands, n): one contiguous row per band, so a band task reads only its own."""
    return np.stack([band_hash(sigs, i, rows) for i in range(bands)]) if len(sigs) else np.zeros((bands, 0), "<u8")


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.count_nonzero(a == b)) / len(a)


@dataclass
class Edges:
    low: np.ndarray  # int64 keys: low < high, high is similar to low
    high: np.ndarray
    candidates: int = 0  # confirmations tried

    @classmethod
    def empty(cls) -> Edges:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))


def bucket_edges(hashes: np.ndarray, keys: np.ndarray, sig_of: Callable[[int], np.ndarray] | None,
                 threshold: float) -> Edges:
    """Edges within equal-hash buckets; `sig_of` None: every member joins the bucket's first (exact dedup)."""
    if len(hashes) < 2:
        return Edges.empty()
    order = np.lexsort((keys, hashes))
    hashes, keys = hashes[order], keys[order]
    starts = np.flatnonzero(np.concatenate(([True], hashes[1:] != hashes[:-1])))
    sizes = np.diff(np.append(starts, len(hashes)))
    low: list[int] = []
    high: list[int] = []
    candidates = 0
    for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist(), strict=True):
        members = keys[start : start + size].tolist()
        if sig_of is None:
            low += [members[0]] * (size - 1)
            high += members[1:]
            continue
        sigs = [sig_of(k) for k in members]
        for j in range(1, size):
            for i in range(min(j, MAX_CONFIRM)):
                candidates += 1
                if similarity(sigs[i], sigs[j]) >= threshold:
                    low.append(members[i])
                    high.append(members[j])
                    break
    return Edges(np.asarray(low, np.int64), np.asarray(high, np.int64), candidates)


def components(low: np.ndarray, high: np.ndarray) -> dict[int, int]:
    """key -> smallest key of its connected component, for every key on an edge but those smallest keys."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while x != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    for start in range(0, len(low), 65536):  # a block at a time: no list of every edge at once
        for a, b in zip(low[start : start + 65536].tolist(), high[start : start + 65536].tolist(), strict=True):
            ra, rb = find(a), find(b)
            if ra != rb:  # the smaller root stays root: every root is its component's smallest key
                parent[max(ra, rb)] = min(ra, rb)
    return {k: find(k) for k in list(parent)}


@dataclass
class Decision:
    index: int
    kept: bool
    reason: str = ""  # exact | near for a dropped text
    duplicate_of: int = -1  # index of the kept text of its cluster
    similarity: float = 1.0


def dedup_texts(texts: Sequence[str], *, threshold: float = 0.7, num_perm: int = 128, shingle: int = 3,
                exact: bool = True, near: bool = True) -> list[Decision]:
    """Dedup a list of texts in one process with the build's exact + MinHash LSH clustering; one decision per
    text (the first text of each cluster is kept). Stable API: benchmarks and peers call this."""
    from mlops.data.dedup import exact_hash, signature

    keys = np.arange(len(texts), dtype=np.int64)
    hashes = np.asarray([exact_hash(t) for t in texts], dtype=np.uint64)
    parts = [bucket_edges(hashes, keys, None, 1.0)] if exact else []
    sigs = np.stack([signature(t, num_perm, shingle) for t in texts]) if near and texts else None
    if sigs is not None:
        bands, rows = lsh_params(threshold, num_perm)
        for band in range(bands):
            parts.append(bucket_edges(band_hash(sigs, band, rows), keys, lambda k: sigs[k], threshold))
    low = np.concatenate([p.low for p in parts]) if parts else np.zeros(0, np.int64)
    high = np.concatenate([p.high for p in parts]) if parts else np.zeros(0, np.int64)
    roots = components(low, high)
    out = []
    for i in range(len(texts)):
        root = roots.get(i, i)
        if root == i:
            out.append(Decision(i, True))
            continue
        same = exact and hashes[i] == hashes[root]
        sim = 1.0 if same or sigs is None else similarity(sigs[i], sigs[root])
        out.append(Decision(i, False, "exact" if same else "near", root, sim))
    return out
