"""The server's side of the request log (`mlops.requestlog`, MLflow traces): answers leave the request path
through a bounded queue.

A background thread takes rows off the queue, scrubs them and writes them as MLflow traces in batches (inside
`requestlog.write_requests`), so neither the store nor the PII scrubber ever runs on the event loop. When the queue
is full the row is dropped and counted (`mlops_serve_request_log_rows_total{outcome="dropped_full"}`): a slow store
costs traces, never a user's latency; a trace that fails to write is counted as `write_error`, its answer already
sent. Retention runs in the same thread, at start and then daily. On SIGTERM the writer writes its backlog for up to
`drain_seconds`; what is left then is kept in a spool file (`serving.request_spool`) that the next server on the same
store writes first. Feedback (`POST /v1/feedback`) is an assessment
on the answer's trace: it checks the request id and the key that sent it against the rows still queued first; the
feedback on an answer still queued rides behind it and is written by the same thread right after its trace.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable

from mlops.requestlog import Feedback, LoggedRequest

log = logging.getLogger("mlops.serve")
PRUNE_EVERY_S = 86400.0


class RequestLogWriter:
    """Writes `LoggedRequest`s on a thread of its own. `LoggedRequest.messages` may be a zero-argument callable
    (e.g. decoding token ids), resolved on that thread too."""

    def __init__(self, *, url: str | None = None, queue_size: int = 10000, batch_rows: int = 200,
                 flush_seconds: float = 0.5, retention_days: float | None = 30.0,
                 process: bool = False, idle_lag_seconds: float = 5.0, drain_seconds: float = 60.0) -> None:
        self.url, self.idle_lag_seconds, self.drain_seconds = url, idle_lag_seconds, drain_seconds
        self.batch_rows, self.flush_seconds, self.retention_days = batch_rows, flush_seconds, retention_days
        # process: the MLflow writes run in a niced child (serving.trace_writer), away from the gateway's GIL.
        self._child = None
        if process:
            from serving.trace_writer import TraceWriterProcess

            self._child = TraceWriterProcess(url, idle=idle_lag_seconds > 0)
        self.counts: Counter = Counter()  # outcome -> rows: written, dropped_full, duplicate, write_error
        self.on_count: Callable[[str, int], None] | None = None  # metrics
        self.feedback_counts: Counter = Counter()  # outcome -> ratings: stored, written_behind, lost
        self.on_feedback_count: Callable[[str], None] | None = None  # metrics
        self.gateway_busy: Callable[[], bool] | None = None  # requests in flight (the server sets it)
        self.pruned = 0
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._pending: Counter = Counter()  # request ids queued and not yet written
        self._pending_keys: dict[str, str | None] = {}  # their user-facing rows' key names (feedback checks)
        self._feedback_behind: dict[str, list[Feedback]] = {}  # feedback on queued answers, written after them
        self._feedback_in_hand = 0  # taken off _feedback_behind, being written
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._abandon = threading.Event()  # the drain's deadline passed: the rest goes to the spool
        self._keep_child = False  # the child was raised to the gateway's priority for the drain (`close`)
        self._in_hand: list[LoggedRequest] = []  # the batch being written
        self._thread: threading.Thread | None = None
        self._last_error = 0.0

    @classmethod
    def from_config(cls, cfg) -> RequestLogWriter:
        """From `serve.request_log` (a `serving_config.RequestLogConfig`)."""
        return cls(url=cfg.database, queue_size=cfg.queue, batch_rows=cfg.batch_rows,
                   flush_seconds=cfg.flush_seconds, retention_days=cfg.retention_days, process=True,
                   idle_lag_seconds=cfg.idle_lag_seconds, drain_seconds=cfg.drain_seconds)

    # ------------------------------------------------------------------ any thread

    def submit(self, row: LoggedRequest) -> bool:
        """Queue a row without ever blocking; False (and counted) when the queue is full."""
        with self._lock:
            try:
                self._queue.put_nowait(row)
            except queue.Full:
                self._count("dropped_full")
                return False
            self._pending[row.request_id] += 1
            if row.role != "shadow":
                self._pending_keys[row.request_id] = row.key
        return True

    def owner(self, request_id: str) -> tuple[bool, str | None]:
        """(a user-facing answer with this id was logged or is about to be, the key name that sent it); shadow
        answers take no feedback."""
        from mlops.requestlog import request_owner

        with self._lock:
            if self._pending.get(request_id) and request_id in self._pending_keys:
                return True, self._pending_keys[request_id]
        return request_owner(request_id, self.url, roles=("user", "canary"))

    def known(self, request_id: str) -> bool:
        return self.owner(request_id)[0]

    def write_feedback(self, item: Feedback) -> str:
        """Rate the answer's trace: at once when it is written ("stored"), else behind it ("queued").

        An answer still queued carries its feedback with it: the writer rates the trace right after writing it.
        Waiting for the trace instead tied a client's feedback to the writer's pace, and the writer is niced below
        the gateway: on a busy machine it falls seconds behind, and the feedback failed."""
        from mlops.requestlog import write_feedback

        with self._lock:
            if self._pending.get(item.request_id):
                self._feedback_behind.setdefault(item.request_id, []).append(item)
                return "queued"
        write_feedback(item, self.url)
        self._count_feedback("stored")
        return "stored"

    def start(self) -> RequestLogWriter:
        if self._thread is not None:  # idempotent: the app starts what it was given
            return self
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued (the process is stopping) for up to `timeout` (default: drain_seconds), then stop;
        rows still unwritten then go to the spool, for the next server on this store."""
        timeout = self.drain_seconds if timeout is None else timeout
        started, backlog = time.monotonic(), self._queue.qsize() + len(self._in_hand)
        if backlog:
            log.info("request log: writing %d queued rows before exit (up to %g s)", backlog, timeout)
        child = self._child
        # A child raised to the gateway's priority drains fastest: it is warm (imports, connections). Where the OS
        # refuses (raising priority needs CAP_SYS_NICE), the thread retires it and writes the rest itself.
        self._keep_child = child is not None and child.hurry()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._spool_the_rest(timeout)
        if self._child is not None:
            self._retire_child()
        if backlog:
            log.info("request log: drained in %.1f s (this server's rows: %s)", time.monotonic() - started,
                     ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())) or "none written")

    def _spool_the_rest(self, timeout: float) -> None:
        from serving.request_spool import spool

        self._abandon.set()
        with self._lock:
            rows = list(self._in_hand)  # perhaps partly written: a replay skips or completes those traces
            while True:
                try:
                    rows.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            ids = {r.request_id for r in rows}
            feedback = [f for rid, items in self._feedback_behind.items() if rid in ids for f in items]
        if self._child is not None:
            child, self._child = self._child, None
            child.close(0)  # its batch is in the spool
        try:
            path = spool(rows, feedback, self.url)
        except Exception as err:  # noqa: BLE001 - nothing else can keep them now
            self._count("lost_at_exit", len(rows))
            log.error("request log: %d rows unwritten after %g s could not be spooled either and are lost (%s: %s). "
                      "Fix: make the spool folder writable (the server's .mlops/serve/), or give the drain longer "
                      "(serve.request_log.drain_seconds)", len(rows), timeout, type(err).__name__, err)
            return
        self._count("spooled", len(rows))
        log.warning("request log: %d rows and %d feedback items unwritten after %g s are kept in %s; the next "
                    "server on this store writes them first (serve.request_log.drain_seconds sets the wait)",
                    len(rows), len(feedback), timeout, path)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued row was attempted (tests, benchmarks); True when the queue emptied in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending and not self._feedback_in_hand:
                    return True
            time.sleep(0.02)
        return False

    # ------------------------------------------------------------------ the writer thread

    def _run(self) -> None:
        self._prune()
        if not self._stop.is_set():  # a server stopping at once leaves the spool to the next one
            self._replay_spool()
        last_prune = time.monotonic()
        while not self._abandon.is_set():
            if self._stop.is_set() and self._child is not None and not self._keep_child:
                self._retire_child()
            batch = self._take()
            if batch:
                self._in_hand = batch
                self._write(batch)
                self._in_hand = []
            if time.monotonic() - last_prune > PRUNE_EVERY_S:
                self._prune()
                last_prune = time.monotonic()
            if self._stop.is_set() and self._queue.empty():
                return

    def _replay_spool(self) -> None:
        """Rows an earlier server on this store could not write before it stopped; written before any new row."""
        from serving.request_spool import claim, load, release

        for path in claim(self.url):
            try:
                rows, feedback = load(path)
                for start in range(0, len(rows), self.batch_rows):  # a spool may hold a whole backlog
                    chunk = rows[start:start + self.batch_rows]
                    skipped = self._write_rows(chunk)  # skipped: written before that server stopped
                    self._count("written", len(chunk) - len(skipped))
                with self._lock:
                    self._feedback_in_hand += len(feedback)
                self._write_feedback_behind(feedback, {r.request_id for r in rows})
            except Exception as err:  # noqa: BLE001 - kept for the next start; serving goes on
                release(path)
                self._error(f"spooled rows in {path.name} could not be written yet ({type(err).__name__}: "
                            f"{str(err)[:300]}); the next start tries again")
                continue
            path.unlink()
            log.info("request log: wrote %d rows and %d feedback items an earlier server had spooled", len(rows),
                     len(feedback))

    def _retire_child(self) -> None:
        """The gateway is draining: no answer's latency is left to protect, so what is still queued is written
        here, at the gateway's priority, not by the niced child that a busy machine starves."""
        child, self._child = self._child, None
        child.close()

    def _take(self) -> list[LoggedRequest]:
        try:
            batch = [self._queue.get(timeout=self.flush_seconds)]
        except queue.Empty:
            return []
        while len(batch) < self.batch_rows:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _write(self, batch: list[LoggedRequest]) -> None:

        rows = []
        for row in batch:
            try:
                if callable(row.messages):
                    row.messages = row.messages()
                rows.append(row)
            except Exception as err:  # noqa: BLE001 - one bad row never costs the batch
                self._error(f"row {row.request_id} could not be prepared ({type(err).__name__}: {err})")
                self._count("write_error")
        traced: set[str] = set()
        try:
            traced = self._written(rows, self._write_rows(rows))
        except (TimeoutError, EOFError, OSError) as err:  # the child died or hung: it was stopped
            traced = self._write_again(rows, err)
        except Exception:  # noqa: BLE001 - retried row by row: one bad row must not cost its neighbours
            traced = self._write_alone(rows)
        finally:
            behind = []
            with self._lock:
                for row in batch:
                    self._pending[row.request_id] -= 1
                    if self._pending[row.request_id] <= 0:
                        del self._pending[row.request_id]
                        self._pending_keys.pop(row.request_id, None)
                        behind += self._feedback_behind.pop(row.request_id, [])
                self._feedback_in_hand += len(behind)
            self._write_feedback_behind(behind, traced)

    def _write_again(self, rows: list[LoggedRequest], err: Exception) -> set[str]:
        """The batch once more, in a fresh child: writing it again is safe (its complete traces are skipped, its
        half-written ones completed). Not once the drain gave up: the batch is in the spool then."""
        if self._abandon.is_set():
            return set()
        log.warning("request log: the trace writer process failed on a batch of %d rows (%s: %s); writing it again",
                    len(rows), type(err).__name__, str(err)[:300])
        try:
            return self._written(rows, self._write_rows(rows))
        except Exception as again:  # noqa: BLE001 - counted and logged; serving goes on
            self._count("write_error", len(rows))
            self._error(f"{len(rows)} traces were lost with the writer process ({type(again).__name__}: {again})")
            return set()

    def _write_feedback_behind(self, items: list[Feedback], traced: set[str]) -> None:
        from mlops.requestlog import write_feedback

        for item in items:
            try:
                if item.request_id not in traced:
                    raise RuntimeError("the answer's trace was not written")
                write_feedback(item, self.url)
                self._count_feedback("written_behind")
            except Exception as err:  # noqa: BLE001 - counted and logged; serving goes on
                self._count_feedback("lost")
                log.error("request log: feedback %s on request %s is lost (%s: %s)", item.feedback_id,
                          item.request_id, type(err).__name__, str(err)[:300])
            finally:
                with self._lock:
                    self._feedback_in_hand -= 1

    def _written(self, rows: list[LoggedRequest], skipped: list[str]) -> set[str]:
        """Counts a written batch; returns the request ids whose trace this batch wrote."""
        self._count("written", len(rows) - len(skipped))
        if skipped:
            self._count("duplicate", len(skipped))
            log.warning("request log: request ids %s were logged before; these answers are not logged again "
                        "(clients should send unique X-Request-ID values)", ", ".join(skipped[:5]))
        return {r.request_id for r in rows} - set(skipped)

    def _write_alone(self, rows: list[LoggedRequest]) -> set[str]:
        traced: set[str] = set()
        for row in rows:
            try:
                traced |= self._written([row], self._write_rows([row]))
            except Exception as err:  # noqa: BLE001 - counted and logged; serving goes on
                self._count("write_error")
                self._error(f"traces could not be written ({type(err).__name__}: {str(err)[:300]})")
        return traced

    def _write_rows(self, rows: list[LoggedRequest]) -> list[str]:
        from mlops.requestlog import write_requests

        left = self._wait_for_a_pause(rows)
        if self._child is not None:
            return self._child.write(rows, idle_for=left)
        return write_requests(rows, self.url)

    def _wait_for_a_pause(self, rows: list[LoggedRequest]) -> float:
        """Hold the batch while the gateway serves requests, up to the idle lag; returns the lag left (the child
        then writes at idle priority for that long). Deferred writes cost a burst of traffic nothing, and a
        backlog past the lag is written anyway, so traffic that never pauses delays traces, never drops them."""
        left = self._idle_for(rows)
        while left > 0 and self.gateway_busy is not None and self.gateway_busy() and not self._stop.is_set():
            time.sleep(0.01)
            left = self._idle_for(rows)
        return left

    def _idle_for(self, rows: list[LoggedRequest]) -> float:
        """How much longer these rows may wait for idle CPU: none once the oldest has waited idle_lag_seconds or a
        quarter of the queue is taken (a writer that only ever waits would drop rows when traffic never pauses)."""
        if self._stop.is_set() or self._queue.qsize() * 4 >= self._queue.maxsize:
            return 0.0
        return self.idle_lag_seconds - (time.time() - min(r.ts for r in rows))

    def _prune(self) -> None:
        if not self.retention_days:
            return
        from mlops.requestlog import prune

        try:
            removed = prune(self.retention_days, self.url)
        except Exception as err:  # noqa: BLE001 - retention runs again tomorrow
            self._error(f"retention could not prune ({type(err).__name__}: {str(err)[:300]})")
            return
        self.pruned += removed
        if removed:
            log.info("request log: pruned %d requests older than %g days", removed, self.retention_days)

    def _count(self, outcome: str, n: int = 1) -> None:
        if n <= 0:
            return
        self.counts[outcome] += n
        if self.on_count is not None:
            self.on_count(outcome, n)

    def _count_feedback(self, outcome: str) -> None:
        # Kept apart from the row counts: a lost rating is the client's signal gone, not a trace.
        self.feedback_counts[outcome] += 1
        if self.on_feedback_count is not None:
            self.on_feedback_count(outcome)

    def _error(self, message: str) -> None:
        # One line per ten seconds at most: a database that is down must not flood the server log.
        now = time.monotonic()
        if now - self._last_error > 10:
            self._last_error = now
            log.error("request log: %s; serving goes on, rows are counted as lost", message)

