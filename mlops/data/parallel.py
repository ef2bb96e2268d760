"""An ordered, bounded process-pool map: results come back in input order, and only a few chunks are in
flight at once, so memory stays flat however long the input stream is."""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any


class OrderedPool:
    """`map(fn, chunks)` over `workers` processes; `workers == 1` runs inline (no pool, no pickling)."""

    def __init__(self, workers: int, initializer: Callable[..., None], initargs: tuple = ()) -> None:
        self.workers = workers
        self.initializer = initializer
        self.initargs = initargs
        self._pool: ProcessPoolExecutor | None = None
        if workers <= 1:
            initializer(*initargs)

    def __enter__(self) -> OrderedPool:
        if self.workers > 1:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # its threads do not survive a fork
            # fork: workers inherit the imported modules and the loaded tokenizer instead of reloading them.
            context = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=self.initializer,
                                             initargs=self.initargs)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def map(self, fn: Callable[[Any], Any], chunks: Iterable[Any]) -> Iterator[Any]:
        return (result for _, result in self.map_pairs(fn, chunks))

    def map_pairs(self, fn: Callable[[Any], Any], chunks: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """(chunk, fn(chunk)) in input order, with at most 2 chunks per worker in flight."""
        if self._pool is None:
            yield from ((chunk, fn(chunk)) for chunk in chunks)
            return
        pending: deque[tuple[Any, Future]] = deque()
        limit = self.workers * 2
        for chunk in chunks:
            pending.append((chunk, self._pool.submit(fn, chunk)))
            if len(pending) >= limit:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()


def chunked(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
