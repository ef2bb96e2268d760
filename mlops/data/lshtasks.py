"""The sharded dedup of a build as worker tasks: one task per (band, hash range), then one cluster task.

Keys: the rows of earlier snapshots (data.dedup.against_snapshots, the history snapshot) come first, in the
order they are named, then each partition's rows in partition order (mlops.data.partitions). A segment is one
such run of keys and the files that hold its hashes and signatures; tasks read them memory-mapped, so what a task
holds is bounded by its shard (mlops.data.lsh.SHARD_RECORDS), not by the input.

The driver plans the tasks and waits (`plan_dedup`); band tasks write their edges to the work folder; the
cluster task joins them into connected components (its memory grows with the duplicates found, not with the
records) and writes each partition's drops, naming for each dropped row the kept record of its cluster.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlops.data.dedup import EXACT_FILE, MINHASH_FILE
from mlops.data.lsh import SHARD_RECORDS, Edges, band_hash, bucket_edges, components, similarity

PRIOR_BLOCK = 65536  # rows read at a time


@dataclass(frozen=True)
class Segment:
    base: int  # first key
    count: int
    exact: str  # .npy of uint64
    sigs: str  # .npy of (count, num_perm) uint32, or "" when near dedup is off
    bands: str = ""  # .npy of (bands, count) uint64: a partition's precomputed band hashes
    snapshot: str = ""  # an earlier snapshot's id: its keys are named "<id>#<row>"
    ids: str = ""  # a partition's record ids as uint64
    folder: str = ""  # a partition's folder (drops.jsonl goes there)


def prior_segment(base: int, snapshot_id: str, folder: Path, near: bool) -> Segment:
    count = len(np.load(folder / EXACT_FILE, mmap_mode="r"))
    return Segment(base, count, str(folder / EXACT_FILE), str(folder / MINHASH_FILE) if near else "",
                   snapshot=snapshot_id)


def partition_segment(base: int, count: int, folder: Path, near: bool) -> Segment:
    return Segment(base, count, str(folder / "exact.npy"), str(folder / "sigs.npy") if near else "",
                   bands=str(folder / "bands.npy") if near else "", ids=str(folder / "ids.npy"), folder=str(folder))


class Npy:
    """Rows of a .npy file read with pread: unlike a memory map, what was read once does not stay in the
    task's resident memory, so a task's RSS is what it keeps, whatever the files' size."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            self.shape, _, self.dtype = read(fh)
            self.offset = fh.tell()
        self.fd = os.open(path, os.O_RDONLY)
        self.width = int(np.prod(self.shape[1:], dtype=np.int64))  # items per row

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, start: int, count: int) -> np.ndarray:
        size = self.dtype.itemsize * self.width
        data = os.pread(self.fd, size * count, self.offset + size * start)
        return np.frombuffer(data, dtype=self.dtype).reshape((count, *self.shape[1:]))

    def __getitem__(self, index: int) -> np.ndarray:
        return self.rows(index, 1)[0]


class Store:
    """Key -> segment, signature, exact hash, name; files opened (not mapped) on first use."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.bases = [s.base for s in segments]
        self._open: dict[str, Npy] = {}

    def array(self, path: str) -> Npy:
        if path not in self._open:
            self._open[path] = Npy(path)
        return self._open[path]

    def close(self) -> None:
        for npy in self._open.values():
            os.close(npy.fd)
        self._open.clear()

    def locate(self, key: int) -> tuple[Segment, int]:
        seg = self.segments[bisect.bisect_right(self.bases, key) - 1]
        return seg, key - seg.base

    def sig(self, key: int) -> np.ndarray:
        seg, row = self.locate(key)
        return self.array(seg.sigs)[row]

    def exact(self, key: int) -> int:
        seg, row = self.locate(key)
        return int(self.array(seg.exact)[row])

    def name(self, key: int) -> str:
        seg, row = self.locate(key)
        if seg.snapshot:
            return f"{seg.snapshot}#{row}"
        return f"r-{int(self.array(seg.ids)[row]):016x}"


def _band_of(store: Store, seg: Segment, band: int, rows: int, start: int, count: int) -> np.ndarray:
    """Hashes of rows [start, start + count) of one segment for `band` (-1: the exact hashes)."""
    if band < 0:
        return store.array(seg.exact).rows(start, count).astype(np.uint64)
    if seg.bands:  # (bands, n): the band's row, a slice of it
        npy = store.array(seg.bands)
        flat = os.pread(npy.fd, 8 * count, npy.offset + 8 * (band * npy.shape[1] + start))
        return np.frombuffer(flat, dtype="<u8").astype(np.uint64)
    sigs = store.array(seg.sigs)  # an earlier snapshot: its signatures, banded here
    if len(sigs.shape) != 2 or sigs.shape[1] < (band + 1) * rows:
        return np.zeros(0, np.uint64)
    return band_hash(sigs.rows(start, count), band, rows)


def _shard_of(store: Store, seg: Segment, task: dict) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, keys) of one segment that fall in the task's hash range, read block by block."""
    shards, shard = task["shards"], task["shard"]
    hashes, keys = [], []
    for start in range(0, seg.count, PRIOR_BLOCK):
        count = min(PRIOR_BLOCK, seg.count - start)
        h = _band_of(store, seg, task["band"], task["rows"], start, count)
        if len(h) != count:  # an earlier snapshot without comparable signatures: not in the LSH
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        mine = (h >> np.uint64(40)) % np.uint64(shards) == shard if shards > 1 else np.ones(count, bool)
        hashes.append(h[mine])
        keys.append(np.flatnonzero(mine).astype(np.int64) + seg.base + start)
    return (np.concatenate(hashes), np.concatenate(keys)) if hashes else (np.zeros(0, np.uint64),
                                                                          np.zeros(0, np.int64))


def band_task(task: dict) -> int:
    """Edges of one band's hash range (band -1: exact dedup) -> <out>.npy; returns the confirmations tried."""
    store = Store(task["segments"])
    try:
        parts = [_shard_of(store, seg, task) for seg in store.segments]
        h = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.uint64)
        k = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        sig_of = None if task["band"] < 0 else store.sig
        edges = bucket_edges(h, k, sig_of, task["threshold"]) if len(h) else Edges.empty()
    finally:
        store.close()
    np.save(task["out"], np.stack([edges.low, edges.high]))
    return edges.candidates


def cluster_task(task: dict) -> int:
    """Connected components of every band's edges -> drops.jsonl in each partition folder; returns the drops."""
    store = Store(task["segments"])
    # A duplicate pair collides in most bands: pack each file's pairs into one int64 and keep the distinct ones as
    # they come, so memory follows the distinct pairs (about the duplicates), not the edges of every band.
    stride = np.int64(max(1, sum(s.count for s in store.segments)))
    packed = np.zeros(0, np.int64)
    for path in task["edges"]:
        pair = np.load(path)
        packed = np.union1d(packed, pair[0].astype(np.int64) * stride + pair[1])
    roots = components(packed // stride, packed % stride)
    first_new = task["first_new"]
    dropped = np.sort(np.fromiter((k for k in roots if k >= first_new), dtype=np.int64))
    drops, out, folder = 0, None, None
    try:  # keys in order are partitions in order: each partition's file is written start to end, then closed
        for key in dropped.tolist():
            root = roots[key]
            seg, row = store.locate(key)
            if seg.folder != folder:
                if out is not None:
                    out.close()
                folder = seg.folder
                out = (Path(folder) / "drops.jsonl").open("w", encoding="utf-8")
            exact = task["exact"] and store.exact(key) == store.exact(root)
            sim = None if exact else round(similarity(store.sig(key), store.sig(root)), 4)
            reason = ("exact" if exact else "near") + ("_of_snapshot" if root < first_new else "")
            out.write(json.dumps([row, reason, store.name(root), sim]) + "\n")
            drops += 1
    finally:
        if out is not None:
            out.close()
        store.close()
    return drops


def plan_dedup(segments: list[Segment], work: Path, exact: bool, near: bool, bands: int, rows: int,
               threshold: float) -> list[dict]:
    """The band tasks: hash ranges per band so that no task holds more than SHARD_RECORDS keys."""
    total = sum(s.count for s in segments)
    shards = max(1, math.ceil(total / SHARD_RECORDS))
    which = ([-1] if exact else []) + (list(range(bands)) if near else [])
    return [{"band": b, "shard": s, "shards": shards, "rows": rows, "threshold": threshold, "segments": segments,
             "out": str(work / f"edges-{b + 1:03d}-{s:04d}.npy")} for b in which for s in range(shards)]
