"""The server's side of the request log (`mlops.requestlog`, MLflow traces): answers leave the request path
through a bounded queue.

A background thread takes rows off the queue, scrubs them and writes them as MLflow traces in batches (inside
`requestlog.write_requests`), so neither the store nor the PII scrubber ever runs on the event loop. When the queue
is full the row is dropped and counted (`mlops_serve_request_log_rows_total{outcome="dropped_full"}`): a slow store
costs traces, never a user's latency; a trace that fails to write is counted as `write_error`, its answer already
sent. Retention runs in the same thread, at start and then daily. Feedback (`POST /v1/feedback`) is an assessment
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

from pydantic import Field

from mlops.requestlog import Feedback, LoggedRequest
from serving.api_schema import _Strict, parse_body

log = logging.getLogger("mlops.serve")
PRUNE_EVERY_S = 86400.0
LOGGED_ROUTES = ("/v1/completions", "/v1/chat/completions")


class FeedbackRequest(_Strict):
    request_id: str = Field(min_length=1, max_length=80, description="the X-Request-ID of the answer rated")
    rating: int = Field(ge=-1, le=1, description="-1 bad, 0 neutral, 1 good")
    correction: str | None = Field(None, max_length=20000, description="what the answer should have said")


def parse_feedback(raw: bytes | None, source: str | None) -> Feedback:
    """The feedback in a request body; an ApiError (400) naming the field when it is malformed."""
    body = parse_body(raw or b"", FeedbackRequest)
    correction = body.correction if body.correction and body.correction.strip() else None
    return Feedback(body.request_id, body.rating, correction=correction, source=source)


def request_messages(prep, engine):
    """A prepared request's prompt as chat messages, as the log stores it (the client's messages, without the
    profile's system prompt). Token-id prompts are decoded later, on the writer's thread."""
    body = prep.body
    if prep.chat:
        return [{"role": m.role, "content": m.text()} for m in body.messages]
    if isinstance(body.prompt, str):
        return [{"role": "user", "content": body.prompt}]
    if body.prompt and isinstance(body.prompt[0], str):
        return [{"role": "user", "content": p} for p in body.prompt]
    ids = [list(p) for p in prep.prompts]
    return lambda: [{"role": "user", "content": engine.detokenize(p)} for p in ids]


def answered_row(model: str, record: dict, serving, capture: dict) -> LoggedRequest:
    """The log row of one answered request, from the middleware's access record and what its handler captured
    (`capture["key"]`: the sending API key's name)."""
    response = capture.get("response")
    if response is None:
        response = "".join(capture.get("parts") or ())  # streamed, possibly cut short by a disconnect
    return LoggedRequest(
        record["request_id"], model[:256], log_version(serving.version), record["route"], capture.get("messages") or [],
        response,
        status=record["status"], role=record.get("role") or "user", profile_hash=serving.profile_hash,
        latency_ms=record["latency_ms"] or 0.0, ttft_ms=record.get("ttft_ms"),
        tokens_in=record.get("prompt_tokens") or 0, tokens_out=record.get("completion_tokens") or 0,
        error=capture.get("error"), key=capture.get("key"), engine=serving_engine(serving),
        quantization=getattr(getattr(serving, "profile", None), "quantization", None),
    )


def serving_engine(serving) -> str | None:
    return getattr(getattr(serving, "engine", None), "name", None)


def log_version(version: str) -> str:
    """A version as the trace's tag holds it: registry versions are short; a folder's name may not be."""
    if len(version) <= 40:
        return version
    import hashlib

    return version[:31] + "~" + hashlib.sha1(version.encode()).hexdigest()[:8]


class RequestLogWriter:
    """Writes `LoggedRequest`s on a thread of its own. `LoggedRequest.messages` may be a zero-argument callable
    (e.g. decoding token ids), resolved on that thread too."""

    def __init__(self, *, url: str | None = None, queue_size: int = 10000, batch_rows: int = 200,
                 flush_seconds: float = 0.5, retention_days: float | None = 30.0,
                 process: bool = False, idle_lag_seconds: float = 5.0) -> None:
        self.url, self.idle_lag_seconds = url, idle_lag_seconds
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
        self._thread: threading.Thread | None = None
        self._last_error = 0.0

    @classmethod
    def from_config(cls, cfg) -> RequestLogWriter:
        """From `serve.request_log` (a `serving_config.RequestLogConfig`)."""
        return cls(url=cfg.database, queue_size=cfg.queue, batch_rows=cfg.batch_rows,
                   flush_seconds=cfg.flush_seconds, retention_days=cfg.retention_days, process=True,
                   idle_lag_seconds=cfg.idle_lag_seconds)

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

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (the process is stopping), then stop."""
        self._stop.set()
        child = self._child
        if child is not None:
            child.hurry()  # its batch in hand; the thread writes the rest itself (_retire_child)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("request log: %d rows were still queued after %.0f s and are lost", self._queue.qsize(),
                          timeout)
        if self._child is not None:
            self._retire_child()

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
        last_prune = time.monotonic()
        while True:
            if self._stop.is_set() and self._child is not None:
                self._retire_child()
            batch = self._take()
            if batch:
                self._write(batch)
            if time.monotonic() - last_prune > PRUNE_EVERY_S:
                self._prune()
                last_prune = time.monotonic()
            if self._stop.is_set() and self._queue.empty():
                return

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
        except (TimeoutError, EOFError, OSError) as err:  # the child went away: it is replaced on the next batch
            self._count("write_error", len(rows))
            self._error(f"{len(rows)} traces were lost with the writer process ({type(err).__name__}: {err})")
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

