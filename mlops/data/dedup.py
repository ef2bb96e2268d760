"""Exact and near deduplication across sources and against earlier snapshots.

Exact: a 64-bit hash of the normalised text (lowercased words, punctuation and spacing dropped).
Near: MinHash signatures of word shingles. The build no longer uses the sequential indexes below: it sorts band
hashes per band in worker tasks and keeps the smallest key of each cluster (mlops.data.lsh, mlops.data.lshtasks;
`mlops.data.lsh.dedup_texts` for a list of texts). `ExactIndex`/`NearIndex` remain the greedy, record-order
index (a MinHash LSH index, datasketch) for callers that feed records one at a time. LSH
only proposes candidates (records sharing a band); a candidate is a near duplicate only when its estimated
Jaccard similarity (share of equal signature rows) reaches the threshold, and the drop names the kept record.
A snapshot stores the hashes and signatures of the records it holds (`dedup/`), so a later build can treat
them as already seen. `ExactIndex`/`NearIndex` keep the index in memory (datasketch MinHashLSH);
mlops.data.diskindex keeps the same banding on disk, so memory stays flat however large the input.

Paraphrases that share few word shingles (synonyms, reordering, a polite prefix) pass all of this; semantic dedup
(`data.dedup.semantic`, off by default) embeds what is left and drops them: mlops.data.semdedup (the rule),
mlops.data.embed (the model), mlops.data.semtasks (the build's tasks).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from mlops.errors import ConfigError

WORD_RE = re.compile(r"\w+", re.UNICODE)
MINHASH_SEED = 1
SCHEME = "affine32"
EXACT_FILE = "dedup/exact.npy"
MINHASH_FILE = "dedup/minhash.npy"
PARAMS_FILE = "dedup/params.json"


def normalise(text: str) -> str:
    return " ".join(WORD_RE.findall(text.lower()))


def hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def exact_hash(text: str) -> int:
    return hash64(normalise(text).encode())


def shingles(text: str, k: int) -> list[bytes]:
    tokens = WORD_RE.findall(text.lower())
    if len(tokens) <= k:
        return [" ".join(tokens).encode()]
    return [" ".join(tokens[i : i + k]).encode() for i in range(len(tokens) - k + 1)]


_PERMUTATIONS: dict[int, object] = {}


def signature(text: str, num_perm: int, k: int) -> np.ndarray:
    from datasketch import MinHash

    # Drawing the permutations costs more than hashing a short text: draw them once per process.
    if num_perm not in _PERMUTATIONS:
        _PERMUTATIONS[num_perm] = MinHash(num_perm=num_perm, seed=MINHASH_SEED, scheme=SCHEME).permutations
    mh = MinHash(num_perm=num_perm, seed=MINHASH_SEED, scheme=SCHEME, permutations=_PERMUTATIONS[num_perm])
    mh.update_batch(shingles(text, k))
    return mh.hashvalues.astype(np.uint32)


def _band_hash(data: bytes) -> bytes:
    # Short band keys keep the LSH tables small; collisions only cost an extra candidate check.
    return hashlib.blake2b(data, digest_size=8).digest()


class Keys:
    """Index keys as small ints, since the indexes are the only state that grows with the input:
    a record id `r-<16 hex>` is its own 64-bit number; records of earlier snapshots get negative numbers."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, str]] = []  # (first negative key, snapshot id)
        self.next_prior = 1
        self.other: list[str] = []
        self._other: dict[str, int] = {}

    def encode(self, key: str) -> int:
        if RECORD_ID.fullmatch(key):
            return int(key[2:], 16)
        sid, sep, row = key.rpartition("#")
        if sep and row.isdigit():
            start = next((first for first, s in self.ranges if s == sid), None)
            if start is not None:
                return -(start + int(row))
        if key not in self._other:  # names that are not record ids (tests, tools) keep their spelling
            self.other.append(key)
            self._other[key] = -(1 << 62) - len(self.other) + 1
        return self._other[key]

    def prior(self, snapshot_id: str, count: int) -> int:
        start = self.next_prior
        self.ranges.append((start, snapshot_id))
        self.next_prior += count
        return start

    def decode(self, key: int) -> str:
        if key >= 0:
            return f"r-{key:016x}"
        if key <= -(1 << 62):
            return self.other[-(1 << 62) - key]
        number = -key
        start, sid = max((r for r in self.ranges if r[0] <= number), key=lambda r: r[0])
        return f"{sid}#{number - start}"


RECORD_ID = re.compile(r"r-[0-9a-f]{16}")


class ExactIndex:
    def __init__(self, keys: Keys | None = None) -> None:
        self.keys = keys or Keys()
        self.seen: dict[int, int] = {}

    def check_add(self, h: int, key: str | int) -> str | None:
        """The key of the earlier record with this hash, else None (and remember this one)."""
        earlier = self.seen.get(h)
        if earlier is None:
            self.seen[h] = key if isinstance(key, int) else self.keys.encode(key)
            return None
        return self.keys.decode(earlier)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Estimated Jaccard similarity of two MinHash signatures: the share of equal rows."""
    return float(np.count_nonzero(np.asarray(a) == np.asarray(b))) / len(a)


def best_match(sig: np.ndarray, candidates: dict[int, np.ndarray], threshold: float) -> tuple[int, float] | None:
    """The most similar candidate at or above the threshold (lowest key on a tie), else None."""
    scored = [(similarity(sig, other), -key) for key, other in candidates.items()]
    scored = [(sim, neg) for sim, neg in scored if sim >= threshold]
    if not scored:
        return None
    sim, neg = max(scored)
    return -neg, sim


class NearIndex:
    def __init__(self, threshold: float, num_perm: int, keys: Keys | None = None) -> None:
        from datasketch import MinHashLSH

        self.keys = keys or Keys()
        self.num_perm = num_perm
        self.threshold = threshold
        self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, hashfunc=_band_hash)
        self.sigs: dict[int, bytes] = {}  # what candidates are confirmed against
        self.candidates = 0  # LSH proposals, confirmed or not (the manifest reports both)

    def _minhash(self, sig: np.ndarray):
        from datasketch import LeanMinHash

        return LeanMinHash(seed=MINHASH_SEED, hashvalues=sig.astype(np.uint64), scheme=SCHEME)

    def check_add(self, sig: np.ndarray, key: str | int) -> tuple[str, float] | None:
        """(key of the earlier near duplicate, estimated similarity), else None (and index this one)."""
        mh = self._minhash(sig)
        found = self.lsh.query(mh)
        self.candidates += len(found)
        match = best_match(sig, {k: np.frombuffer(self.sigs[k], dtype="<u4") for k in found}, self.threshold)
        if match is not None:
            return self.keys.decode(match[0]), match[1]
        self.insert(key if isinstance(key, int) else self.keys.encode(key), sig, mh)
        return None

    def insert(self, key: int, sig: np.ndarray, mh=None) -> None:
        self.lsh.insert(key, mh if mh is not None else self._minhash(sig))
        self.sigs[key] = np.asarray(sig, dtype="<u4").tobytes()


def save_index(folder: Path, exact: list[int], sigs: list[np.ndarray], params: dict) -> None:
    """What a later build needs to treat this snapshot's records as already seen."""
    (folder / "dedup").mkdir(parents=True, exist_ok=True)
    np.save(folder / EXACT_FILE, np.asarray(exact, dtype=np.uint64))
    width = params["num_perm"]
    matrix = np.stack(sigs).astype(np.uint32) if sigs else np.zeros((0, width), dtype=np.uint32)
    np.save(folder / MINHASH_FILE, matrix)
    (folder / PARAMS_FILE).write_text(json.dumps(params, sort_keys=True) + "\n")


def load_prior(folder: Path, snapshot_id: str, params: dict, exact: Any, near: Any) -> int:
    """Add an earlier snapshot's records to the indexes; returns how many were added."""
    check_prior(folder, snapshot_id, params, near is not None)
    hashes = np.load(folder / EXACT_FILE)
    start = exact.keys.prior(snapshot_id, len(hashes))
    for i, h in enumerate(hashes.tolist()):
        exact.check_add(int(h), -(start + i))
    if near is not None:
        for i, sig in enumerate(np.load(folder / MINHASH_FILE, mmap_mode="r")):
            near.insert(-(start + i), np.asarray(sig))
    return len(hashes)


def check_prior(folder: Path, snapshot_id: str, params: dict, near: bool) -> None:
    """An earlier snapshot can be deduplicated against: it has an index, and comparable signatures."""
    params_path = folder / PARAMS_FILE
    if not params_path.exists():
        raise ConfigError(
            f"snapshot {snapshot_id} has no dedup index ({PARAMS_FILE}), so it cannot be deduplicated against. "
            "Fix: remove it from data.dedup.against_snapshots, or rebuild it with `mlops data build`."
        )
    stored = json.loads(params_path.read_text())
    if near and {k: stored.get(k) for k in ("num_perm", "shingle")} != {
        k: params[k] for k in ("num_perm", "shingle")
    }:
        raise ConfigError(
            f"snapshot {snapshot_id} was deduplicated with num_perm={stored.get('num_perm')}, "
            f"shingle={stored.get('shingle')}; this build uses num_perm={params['num_perm']}, "
            f"shingle={params['shingle']}. Fix: set data.dedup.num_perm and data.dedup.shingle to the "
            "snapshot's values so signatures are comparable."
        )
