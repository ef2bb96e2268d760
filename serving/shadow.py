"""Shadow traffic: a share of user requests is answered again by a candidate model, in the background.

The user's answer is never touched: a request is offered to the shadow only after its own answer was sent
(from the middleware's last step), the offer never blocks (a bounded queue; a full one drops the offer and
counts it), and the shadow engine runs at lower priority: its worker steps aside between decode steps
whenever a user-facing engine has work (`Engine.yield_to`). One shadow request runs at a time. The candidate
answers the same request body under its own deployment profile (its chat template, system prompt and default
sampling), exactly as it would if it were promoted.

Both answers go to the request log: the user's with its request id, the shadow's as `<id>:shadow` with
`role='shadow'` and `parent_id` = the user's id. The shadow's latency excludes the time it stood aside, so
the shadow report compares model latency, not the queueing a lower priority implies.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from serving.canary import sampled

log = logging.getLogger("mlops.serve")


@dataclass
class ShadowTarget:
    """What `mlops serve --shadow` loads: the candidate's folder, profile and version."""

    model_dir: Path | None  # None: no candidate yet (`--follow` swaps one in when it is registered)
    profile: object  # profile.DeploymentProfile
    version: str | None


@dataclass
class _Offer:
    request_id: str
    route: str
    body: bytes
    offered_at: float


class ShadowRunner:
    """Answers sampled requests on `slot` (the candidate) in the background; see the module docstring."""

    def __init__(self, slot, *, share: float, queue_size: int = 16, timeout: float = 120.0,
                 idle_ms: float = 50.0, salt: str | None = None) -> None:
        self.slot = slot  # serving.slot.ModelSlot holding the candidate
        # A secret per server: with a known salt a client could pick request ids that are (or are never) shadowed
        # and so steer which of its requests become the candidate's shadow evidence.
        self.salt = salt or secrets.token_hex(16)
        self.share, self.timeout, self.idle_s = share, timeout, idle_ms / 1000
        self._last_busy = 0.0
        self.counts: dict[str, int] = {}
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._primaries: list = []
        self._ctx = None
        self._outstanding = 0  # offers queued or running
        self._job = None  # the generation running now (cancelled when the server stops)
        self._lock = threading.Lock()
        slot.listeners.append(self._lower_priority)
        if slot.current is not None:
            self._lower_priority(slot.current)

    def attach(self, ctx) -> ShadowRunner:
        """Wire to a server: the slots whose work comes first, the metrics, the request log, the model name."""
        self._ctx = ctx
        self._primaries = [ctx.slot, *([ctx.canary.slot] if ctx.canary is not None else [])]
        ctx.metrics.shadow_pending.set_function(lambda: float(self._outstanding))
        return self

    # ------------------------------------------------------------------ the request path (event loop)

    def offer(self, request_id: str, route: str, body: bytes) -> bool:
        """Maybe shadow this answered request; never blocks. True when it was queued."""
        if self._stop.is_set() or self.slot.current is None or not sampled(request_id, self.share, self.salt):
            return False  # stopping, no candidate loaded yet, or not in the sampled share
        with self._lock:  # counted before it is queued: `wait_idle` must never see a taken offer as none
            self._outstanding += 1
        try:
            self._queue.put_nowait(_Offer(request_id, route, body, time.monotonic()))
        except queue.Full:
            self._done()
            self._count("dropped_busy")
            return False
        return True

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ShadowRunner:
        if self._thread is not None:  # idempotent: the app starts what it was given
            return self
        self._thread = threading.Thread(target=self._run, name="shadow", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking offers; what is queued is dropped (counted): a stopping server waits for users, not shadows."""
        self._stop.set()
        job = self._job
        if job is not None:
            job.cancelled.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.slot.close()

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Every offer so far was answered or dropped (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while self._outstanding > 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _done(self) -> None:
        with self._lock:
            self._outstanding -= 1

    def primary_busy(self) -> bool:
        """A user-facing engine has work, or had some less than `idle_ms` ago: under steady traffic the gaps
        between requests are too short to fit a shadow step without delaying the next user."""
        now = time.monotonic()
        for slot in self._primaries:
            serving = slot.current
            busy = getattr(serving.engine, "busy", None) if serving is not None else None
            if busy is not None and busy():
                self._last_busy = now
                return True
        return now - self._last_busy < self.idle_s

    # ------------------------------------------------------------------ the shadow thread

    def _lower_priority(self, serving) -> None:
        try:
            serving.engine.yield_to = self.primary_busy
        except AttributeError:  # a test fake
            pass

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                offer = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                while self.primary_busy() and not self._stop.is_set() and \
                        time.monotonic() - offer.offered_at <= self.timeout:
                    time.sleep(0.005)  # even preparing (tokenizing) waits for a quiet moment
                if self._stop.is_set():
                    self._count("dropped_draining")
                elif time.monotonic() - offer.offered_at > self.timeout:
                    self._count("dropped_busy")  # waited out its time behind user traffic
                else:
                    self._answer(offer)
            except Exception:  # noqa: BLE001 - a shadow failure must never reach the server
                log.exception("shadow: request_id=%s could not be shadowed", offer.request_id)
                self._count("failed")
            finally:
                self._done()
        while True:  # stopping: what is left is dropped, counted
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            self._count("dropped_draining")
            self._done()

    def _answer(self, offer: _Offer) -> None:
        from mlops.requestlog import LoggedRequest
        from serving.api_schema import ApiError
        from serving.completions import View, prepare_chat, prepare_completion
        from serving.request_rows import log_version, request_messages, serving_engine
        from serving.slot import SlotError

        ctx = self._ctx
        try:
            serving = self.slot.acquire()
        except SlotError:
            self._count("failed")
            return
        try:
            view = View(ctx.slot.name, serving, ctx.config)
            row = LoggedRequest(f"{offer.request_id}:shadow", (ctx.log_model or ctx.slot.name)[:256],
                                log_version(serving.version),
                                offer.route, [], "", role="shadow", parent_id=offer.request_id,
                                profile_hash=serving.profile_hash, engine=serving_engine(serving),
                                quantization=serving.profile.quantization)
            prepare = prepare_chat if offer.route == "/v1/chat/completions" else prepare_completion
            try:
                prep = prepare(view, offer.body)
            except ApiError as err:  # e.g. the candidate's context is shorter: the candidate's own failure
                row.status, row.error = err.status, err.message
                self._finish(row, "failed")
                return
            row.messages, row.tokens_in = request_messages(prep, serving.engine), len(prep.prompts[0])
            self._generate(serving, prep, row)
        finally:
            self.slot.release(serving)

    def _generate(self, serving, prep, row) -> None:
        engine = serving.engine
        yielded, started = engine.yielded(), time.perf_counter()
        job = self._job = engine.generate(prep.prompts[0], prep.params[0], owner=object())
        outcome = "answered"
        try:
            gen = job.future.result(timeout=self.timeout)
            row.response, row.tokens_out = gen.text, len(gen.tokens)
            if gen.finish_reason == "cancelled":  # the server is stopping
                row.status, row.error, outcome = 503, "the server stopped before the shadow answered", \
                    "dropped_draining"
        except concurrent.futures.TimeoutError:
            job.cancelled.set()
            row.status, row.error, outcome = 504, f"the shadow answer took longer than {self.timeout:g} s", "timed_out"
            if engine.yielded() - yielded > self.timeout / 2:  # starved by user traffic, not slow of its own
                outcome = "dropped_busy"
        except Exception as err:  # noqa: BLE001 - the candidate's failure, recorded as such
            row.status, row.error, outcome = 500, f"{type(err).__name__}: {err}", "failed"
        self._job = None
        stood_aside = engine.yielded() - yielded
        row.latency_ms = round(max(0.0, time.perf_counter() - started - stood_aside) * 1000, 1)
        if job.first_token_at is not None and stood_aside == 0:  # unknown how much of a wait came before it
            row.ttft_ms = round((job.first_token_at - started) * 1000, 1)
        self._finish(row, outcome)

    def _finish(self, row, outcome: str) -> None:
        ctx = self._ctx
        if outcome == "answered":
            ctx.metrics.shadow_latency.labels(row.version).observe(row.latency_ms / 1000)
        self._count(outcome, row.version)  # before the row is queued: a flushed log implies the counter moved
        # Only the candidate's own answers and failures are evidence: one cut short by user traffic or by the
        # server stopping says nothing about it, and is only counted.
        if ctx.request_log is not None and not outcome.startswith("dropped"):
            ctx.request_log.submit(row)

    def _count(self, outcome: str, version: str | None = None) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if self._ctx is not None:
            serving = self.slot.current
            version = version or (serving.version if serving is not None else "-")
            self._ctx.metrics.shadow_requests.labels(version, outcome).inc()

