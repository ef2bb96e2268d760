"""Exact and near deduplication across sources and against earlier snapshots.

Exact: a 64-bit hash of the normalised text (lowercased words, punctuation and spacing dropped).
Near: MinHash signatures of word shingles (computed in worker processes) in a MinHash LSH index (datasketch),
queried and filled in record order in the main process so the result does not depend on worker timing.
A snapshot stores the hashes and signatures of the records it holds (`dedup/`), so a later build can treat
them as already seen.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

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


def signature(text: str, num_perm: int, k: int) -> np.ndarray:
    from datasketch import MinHash

    mh = MinHash(num_perm=num_perm, seed=MINHASH_SEED, scheme=SCHEME)
    mh.update_batch(shingles(text, k))
    return mh.hashvalues.astype(np.uint32)


def _band_hash(data: bytes) -> bytes:
    # Short band keys keep the LSH tables small; collisions only cost an extra candidate check.
    return hashlib.blake2b(data, digest_size=8).digest()


class ExactIndex:
    def __init__(self) -> None:
        self.seen: dict[int, str] = {}

    def check_add(self, h: int, key: str) -> str | None:
        """The key of the earlier record with this hash, else None (and remember this one)."""
        earlier = self.seen.get(h)
        if earlier is None:
            self.seen[h] = key
        return earlier


class NearIndex:
    def __init__(self, threshold: float, num_perm: int) -> None:
        from datasketch import MinHashLSH

        self.num_perm = num_perm
        self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, hashfunc=_band_hash)

    def _minhash(self, sig: np.ndarray):
        from datasketch import LeanMinHash

        return LeanMinHash(seed=MINHASH_SEED, hashvalues=sig.astype(np.uint64), scheme=SCHEME)

    def check_add(self, sig: np.ndarray, key: str) -> str | None:
        """The key of an earlier near duplicate, else None (and index this one)."""
        mh = self._minhash(sig)
        found = self.lsh.query(mh)
        if found:
            return min(found)  # stable choice when several match
        self.lsh.insert(key, mh)
        return None


def save_index(folder: Path, exact: list[int], sigs: list[np.ndarray], params: dict) -> None:
    """What a later build needs to treat this snapshot's records as already seen."""
    (folder / "dedup").mkdir(parents=True, exist_ok=True)
    np.save(folder / EXACT_FILE, np.asarray(exact, dtype=np.uint64))
    width = params["num_perm"]
    matrix = np.stack(sigs).astype(np.uint32) if sigs else np.zeros((0, width), dtype=np.uint32)
    np.save(folder / MINHASH_FILE, matrix)
    (folder / PARAMS_FILE).write_text(json.dumps(params, sort_keys=True) + "\n")


def load_prior(folder: Path, snapshot_id: str, params: dict, exact: ExactIndex, near: NearIndex | None) -> int:
    """Add an earlier snapshot's records to the indexes; returns how many were added."""
    params_path = folder / PARAMS_FILE
    if not params_path.exists():
        raise ConfigError(
            f"snapshot {snapshot_id} has no dedup index ({PARAMS_FILE}), so it cannot be deduplicated against. "
            "Fix: remove it from data.dedup.against_snapshots, or rebuild it with `mlops data build`."
        )
    stored = json.loads(params_path.read_text())
    if near is not None and {k: stored.get(k) for k in ("num_perm", "shingle")} != {
        k: params[k] for k in ("num_perm", "shingle")
    }:
        raise ConfigError(
            f"snapshot {snapshot_id} was deduplicated with num_perm={stored.get('num_perm')}, "
            f"shingle={stored.get('shingle')}; this build uses num_perm={params['num_perm']}, "
            f"shingle={params['shingle']}. Fix: set data.dedup.num_perm and data.dedup.shingle to the "
            "snapshot's values so signatures are comparable."
        )
    hashes = np.load(folder / EXACT_FILE)
    for i, h in enumerate(hashes.tolist()):
        exact.check_add(int(h), f"{snapshot_id}#{i}")
    if near is not None:
        for i, sig in enumerate(np.load(folder / MINHASH_FILE)):
            near.lsh.insert(f"{snapshot_id}#{i}", near._minhash(sig))
    return len(hashes)
