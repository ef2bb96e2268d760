"""Backoff for password sign-in on the server: failed attempts per user and per client address lock the next ones
out for a doubling window, answered 429 with Retry-After and without running the expensive check.

Only password sign-in (`Bearer <user>:<password>`) is counted and locked; API keys are looked up by digest first
and never wait here. A success clears the user's count (not the address's: one valid account must not buy an
address more guesses at other users). Counts are forgotten `forget` seconds after the last failure. Checks still
running count as failures until they end, so a burst sent all at once cannot run more checks than the free
attempts. Behind a proxy every client shares the proxy's address: give the address budget room for that.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass


@dataclass
class _Count:
    failures: int = 0
    running: int = 0
    last: float = 0.0


class Backoff:
    """Per-key failure counts (keys: `user:<name>`, `addr:<ip>`) and the lockout they earn; thread-safe."""

    def __init__(self, *, free_per_user: int = 5, free_per_address: int = 20, base: float = 1.0,
                 cap: float = 300.0, forget: float = 900.0, clock=time.monotonic) -> None:
        self.free = {"user": free_per_user, "addr": free_per_address}
        self.base, self.cap, self.forget, self.clock = base, cap, forget, clock
        self._lock = threading.Lock()
        self._counts: dict[str, _Count] = {}

    def _free(self, key: str) -> int:
        return self.free[key.partition(":")[0]]

    def _get(self, key: str, now: float) -> _Count:
        count = self._counts.get(key)
        if count is None or (not count.running and now - count.last > self.forget):
            count = self._counts[key] = _Count()
        return count

    def _wait(self, key: str, count: _Count, now: float) -> float:
        if count.failures + count.running < self._free(key):
            return 0.0
        if count.failures < self._free(key):
            return 1.0  # the free attempts are all running now: ask again when they are done
        window = min(self.cap, self.base * 2 ** (count.failures - self._free(key)))
        return max(0.0, count.last + window - now)

    def begin(self, keys: list[str]) -> float:
        """0 and the attempt is counted as running (call `end` after it), or the seconds still locked out."""
        now = self.clock()
        with self._lock:
            counts = [(k, self._get(k, now)) for k in keys]
            wait = max((self._wait(k, c, now) for k, c in counts), default=0.0)
            if wait > 0:
                return float(math.ceil(wait))
            for _, count in counts:
                count.running += 1
            return 0.0

    def end(self, keys: list[str], *, ok: bool | None) -> None:
        """The attempt begun with `begin(keys)` ended: succeeded, failed, or (None) could not be checked."""
        now = self.clock()
        with self._lock:
            if len(self._counts) > 100_000:  # bounded: an address sweep must not grow memory without end
                self._counts = {k: c for k, c in self._counts.items() if c.running}
            for key in keys:
                count = self._get(key, now)
                count.running = max(0, count.running - 1)
                if ok is False:
                    count.failures, count.last = count.failures + 1, now
                elif ok and key.startswith("user:"):
                    count.failures = 0
