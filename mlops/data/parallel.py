"""An ordered, bounded process-pool map: results come back in input order, and only a few chunks are in
flight at once, so memory stays flat however long the input stream is.

Workers never outlive the build. Each one asks the kernel for SIGKILL when its parent dies (Linux
PR_SET_PDEATHSIG) and also watches its parent pid from a thread (any POSIX), so a SIGKILLed build leaves no
worker behind; workers ignore SIGINT and SIGTERM so only the parent decides; and when the parent leaves the
pool with an error (a bad config, SIGTERM, Ctrl-C), it terminates the workers instead of waiting for queued
work.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from mlops.errors import WorkerDied

PARENT_POLL_S = 1.0


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the watcher thread below is enough

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(PARENT_POLL_S)

    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_init(parent: int, initializer: Callable[..., None], initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent)
    initializer(*initargs)


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
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_worker_init,
                                             initargs=(os.getpid(), self.initializer, self.initargs))
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if exc_type is None:
            pool.shutdown(wait=True)
            return
        self.terminate(pool)

    def pids(self) -> list[int]:
        return [p.pid for p in (self._pool._processes or {}).values()] if self._pool else []

    @staticmethod
    def terminate(pool: ProcessPoolExecutor) -> None:
        """Stop now: queued work is cancelled, running workers are killed and reaped (no orphan, no zombie)."""
        processes = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in processes:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1)

    def map(self, fn: Callable[[Any], Any], chunks: Iterable[Any]) -> Iterator[Any]:
        return (result for _, result in self.map_pairs(fn, chunks))

    def map_pairs(self, fn: Callable[[Any], Any], chunks: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """(chunk, fn(chunk)) in input order, with at most 2 chunks per worker in flight."""
        if self._pool is None:
            yield from ((chunk, fn(chunk)) for chunk in chunks)
            return
        pending: deque[tuple[Any, Future]] = deque()
        limit = self.workers * 2
        try:
            for chunk in chunks:
                pending.append((chunk, self._pool.submit(fn, chunk)))
                if len(pending) >= limit:
                    done, future = pending.popleft()
                    yield done, future.result()
            while pending:
                done, future = pending.popleft()
                yield done, future.result()
        except BrokenProcessPool:
            raise WorkerDied(
                f"a data worker process died while running {getattr(fn, '__name__', fn)} (killed by the OS, most "
                "likely out of memory). Fix: lower data.workers or data.batch_size, or give the build more memory; "
                "nothing was published."
            ) from None


def open_executor(data: Any, initializer: Callable[..., None], initargs: tuple = ()) -> Any:
    """The pool `data.executor` names: local processes, or Ray tasks (mlops.data.ray_executor). Both map in
    input order, so the build and its snapshot are the same on either."""
    if data.executor == "ray":
        from mlops.data.ray_executor import RayPool

        return RayPool(data.ray, data.workers, initializer, initargs)
    return OrderedPool(data.workers, initializer, initargs)


def chunked(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
