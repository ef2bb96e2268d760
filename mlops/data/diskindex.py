"""Dedup indexes on disk (SQLite in the build's work folder), so memory stays flat as the input grows.

`DiskNearIndex` is MinHash LSH with the band count and width datasketch's MinHashLSH picks for the threshold
and number of permutations: a record is a near-duplicate candidate when any of its b bands of r signature
rows collides with an earlier record's. Each band bucket keeps the first key (record id, or snapshot#row)
that filled it, and every indexed key's signature, so each candidate is confirmed against the threshold by its
estimated Jaccard similarity exactly as the in-memory index does: both keep the same records.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import numpy as np

from mlops.data.dedup import Keys, best_match


def connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    # A scratch index in a folder that is deleted after the build: durability buys nothing here.
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("PRAGMA cache_size=-16000")  # 16 MB page cache, whatever the input size
    # One open transaction for the whole build: a commit per record was most of the index's cost. Nothing
    # ever reads this file after the connection closes, so it is never committed.
    db.execute("BEGIN")
    return db


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


class DiskExactIndex:
    def __init__(self, db: sqlite3.Connection, keys: Keys) -> None:
        self.db = db
        self.keys = keys
        db.execute("CREATE TABLE IF NOT EXISTS exact (h INTEGER PRIMARY KEY, key TEXT NOT NULL)")

    def check_add(self, h: int, key: str | int) -> str | None:
        h = _signed(h)
        row = self.db.execute("SELECT key FROM exact WHERE h = ?", (h,)).fetchone()
        if row is not None:
            return row[0]
        self.db.execute("INSERT INTO exact VALUES (?, ?)", (h, self.keys.decode(key) if isinstance(key, int) else key))
        return None


class DiskNearIndex:
    def __init__(self, db: sqlite3.Connection, threshold: float, num_perm: int, keys: Keys) -> None:
        from datasketch import MinHashLSH

        probe = MinHashLSH(threshold=threshold, num_perm=num_perm)  # only for its choice of (b, r)
        self.b, self.r = probe.b, probe.r
        self.db = db
        self.keys = keys
        self.num_perm = num_perm
        self.threshold = threshold
        self.candidates = 0
        # Each indexed record once in `sigs` (its key and signature); band rows point at it by row number.
        db.execute("CREATE TABLE IF NOT EXISTS sigs (r INTEGER PRIMARY KEY, key TEXT NOT NULL, sig BLOB NOT NULL)")
        db.execute("CREATE TABLE IF NOT EXISTS bands (h INTEGER NOT NULL, r INTEGER NOT NULL, PRIMARY KEY (h, r))"
                   " WITHOUT ROWID")
        self._query = (f"SELECT key, sig FROM sigs WHERE r IN "
                       f"(SELECT DISTINCT r FROM bands WHERE h IN ({','.join('?' * self.b)}))")

    def bands(self, sig: np.ndarray) -> list[int]:
        raw = np.asarray(sig, dtype="<u4")
        out = []
        for i in range(self.b):
            band = i.to_bytes(2, "little") + raw[i * self.r : (i + 1) * self.r].tobytes()
            out.append(_signed(int.from_bytes(hashlib.blake2b(band, digest_size=8).digest(), "little")))
        return out

    def check_add(self, sig: np.ndarray, key: str | int) -> tuple[str, float] | None:
        """(key of the earlier near duplicate, estimated similarity), else None (and index this one)."""
        hashes = self.bands(sig)
        rows = self.db.execute(self._query, hashes).fetchall()
        self.candidates += len(rows)
        # Candidates by their int key, so ties break as in the in-memory index (lowest key).
        found = {self.keys.encode(k): np.frombuffer(blob, dtype="<u4") for k, blob in rows}
        match = best_match(sig, found, self.threshold)
        if match is not None:
            return self.keys.decode(match[0]), match[1]
        self._insert(hashes, self.keys.decode(key) if isinstance(key, int) else key, sig)
        return None

    def insert(self, key: int, sig: np.ndarray) -> None:
        self._insert(self.bands(sig), self.keys.decode(key), sig)

    def _insert(self, hashes: list[int], key: str, sig: np.ndarray) -> None:
        row = self.db.execute("INSERT INTO sigs (key, sig) VALUES (?, ?)",
                              (key, np.asarray(sig, dtype="<u4").tobytes())).lastrowid
        self.db.executemany("INSERT OR IGNORE INTO bands VALUES (?, ?)", [(h, row) for h in hashes])
