"""The model slot: which (engine, profile, version) answers new requests, replaceable while requests run.

Every request leases the serving that is current when it arrives and keeps it to its last byte, streaming
included. `swap` installs a new serving atomically: new requests go to it, requests already running finish
on the old one, and the old engine is closed once its last lease is returned. `load_and_swap` is what alias
following (`mlops serve --follow`) calls: it loads the new model beside the old one, checks that it answers,
then swaps; a model that fails to load or answer never replaces the one serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlops.errors import MLOpsError
from mlops.profile import DeploymentProfile
from serving.engine import Engine, EngineSpec, build_engine, default_threads

log = logging.getLogger("mlops.serve")


class SlotError(MLOpsError):
    """A model could not be loaded into the slot, or failed its health check; the old one keeps serving."""


@dataclass(eq=False)
class Serving:
    """One loaded model version and the requests running on it."""

    engine: Engine  # or a test fake with the same methods
    profile: DeploymentProfile
    version: str
    model_dir: Path | None = None
    loaded_at: int = field(default_factory=lambda: int(time.time()))
    inflight: int = 0
    retired: bool = False
    closed: bool = False
    _profile_hash: str | None = None

    @property
    def profile_hash(self) -> str:
        """The profile's hash, computed once (the request log and metrics name it on every request)."""
        if self._profile_hash is None:
            self._profile_hash = self.profile.profile_hash()
        return self._profile_hash


class ModelSlot:
    """Holds the current `Serving`; thread-safe; see the module docstring for the swap contract."""

    def __init__(self, name: str, *, close_timeout: float = 30.0) -> None:
        self.name = name
        self.close_timeout = close_timeout
        self._lock = threading.Condition()
        self._current: Serving | None = None
        self._retired: list[Serving] = []
        self.swaps = 0
        # How load_and_swap builds an engine; the server sets one with its configured batch limits.
        self.engine_factory: Callable[[Path, DeploymentProfile], Engine] = _default_engine
        self.listeners: list[Callable[[Serving], None]] = []  # told about each new serving (metrics)

    # ------------------------------------------------------------------ reading

    @property
    def current(self) -> Serving | None:
        return self._current

    def acquire(self) -> Serving:
        """Lease the current serving; every acquire needs one `release`. Raises SlotError when empty."""
        with self._lock:
            serving = self._current
            if serving is None:
                raise SlotError(f"no model is loaded into the slot for '{self.name}' yet.")
            serving.inflight += 1
            return serving

    def release(self, serving: Serving) -> None:
        with self._lock:
            serving.inflight -= 1
            close = serving.retired and serving.inflight == 0 and not serving.closed
            if close:
                serving.closed = True
            self._lock.notify_all()
        if close:
            self._close_later(serving)

    def inflight(self) -> int:
        with self._lock:
            return sum(s.inflight for s in [*self._retired, *([self._current] if self._current else [])])

    # ------------------------------------------------------------------ replacing

    def swap(self, engine, profile, version: str, *, model_dir: Path | str | None = None) -> Serving | None:
        """Install a loaded engine; returns the serving it replaced (closed once drained), if any."""
        new = Serving(engine, profile, str(version), Path(model_dir) if model_dir else None)
        with self._lock:
            old, self._current = self._current, new
            close = False
            if old is not None:
                old.retired = True
                self._retired.append(old)
                close = old.inflight == 0 and not old.closed
                if close:
                    old.closed = True
            self.swaps += 1
        for listener in self.listeners:
            listener(new)
        if old is not None:
            log.info("model slot '%s': version %s replaces %s (%d requests still running on the old one)",
                     self.name, new.version, old.version, old.inflight)
        if close:
            self._close_later(old)
        return old

    def unload(self) -> Serving | None:
        """Empty the slot (a canary stopped): new requests find no model; running ones finish, then it closes."""
        with self._lock:
            old, self._current = self._current, None
            close = False
            if old is not None:
                old.retired = True
                self._retired.append(old)
                close = old.inflight == 0 and not old.closed
                if close:
                    old.closed = True
        if old is not None:
            log.info("model slot '%s': version %s unloaded (%d requests still running on it)", self.name,
                     old.version, old.inflight)
        if close:
            self._close_later(old)
        return old

    def load_and_swap(self, model_dir: Path | str, profile, version: str, *,
                      engine_factory: Callable[[Path, DeploymentProfile], Engine] | None = None,
                      check_timeout: float = 120.0) -> Serving:
        """Load `model_dir` beside the serving model, check it answers, swap it in; the old one drains and closes.

        Raises SlotError (and keeps the old model serving) when the folder does not load, its chat template
        does not match the profile, or it fails the check.
        """
        from mlops.profile import check_template

        model_dir = Path(model_dir)
        problem = check_template(profile, model_dir)
        if problem:
            raise SlotError(f"version {version} was not swapped in: {problem}. Fix: register it with its own profile.")
        try:
            engine = (engine_factory or self.engine_factory)(model_dir, profile)
        except Exception as err:
            raise SlotError(f"version {version} ({model_dir}) could not be loaded: {type(err).__name__}: {err}. "
                            "The serving version keeps serving.") from err
        try:
            check_engine(engine, timeout=check_timeout)
        except Exception as err:
            engine.close()
            raise SlotError(f"version {version} loaded but failed its health check ({type(err).__name__}: {err}); "
                            "the serving version keeps serving.") from err
        self.swap(engine, profile, version, model_dir=model_dir)
        return self._current

    # ------------------------------------------------------------------ shutting down

    def wait_drained(self, timeout: float) -> bool:
        """Wait until no request runs on any serving; True when drained in time."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self.inflight() > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.5))
        return True

    def close(self) -> None:
        """Close every engine (the process is stopping)."""
        with self._lock:
            servings = [s for s in [*self._retired, self._current] if s is not None and not s.closed]
            for serving in servings:
                serving.closed = True
        for serving in servings:
            serving.engine.close()

    def ready(self, stall_seconds: float = 120.0) -> tuple[bool, str]:
        """(ready, reason): a model is loaded, its worker runs, and it is not stuck with work waiting."""
        serving = self._current
        if serving is None:
            return False, "no model loaded"
        alive = getattr(serving.engine, "alive", lambda: True)
        if not alive():
            return False, "the engine worker is not running"
        stalled = getattr(serving.engine, "stalled", lambda _s: False)
        if stalled(stall_seconds):
            return False, f"the engine has made no progress for {stall_seconds:.0f} s with work waiting"
        return True, "ready"

    def _close_later(self, serving: Serving) -> None:
        # Closing joins the engine's worker: never on the event loop.
        def close() -> None:
            serving.engine.close()
            with self._lock:
                if serving in self._retired:
                    self._retired.remove(serving)
            log.info("model slot '%s': version %s drained and closed", self.name, serving.version)

        threading.Thread(target=close, name=f"close-{serving.version}", daemon=True).start()


def check_engine(engine, timeout: float) -> None:
    """The engine scores one prompt and generates one token (what /ready promises)."""
    from serving.engine import GenParams

    ids = engine.tokenize("Hello") or [0]
    scored = engine.score([ids]).result(timeout=timeout)
    if not scored or len(scored[0].token_logprobs) != len(ids) + 1:
        raise RuntimeError("scoring returned a malformed result")
    engine.generate(ids, GenParams(max_tokens=1)).future.result(timeout=timeout)


def _default_engine(model_dir: Path, profile: DeploymentProfile) -> Engine:
    """The engine the profile names, with default settings (the server sets one with its configured limits)."""
    options = {"quantization": profile.quantization or "q8_0"} if profile.engine == "llamacpp" else {}
    return build_engine(model_dir, EngineSpec(profile.engine, threads=default_threads(), options=options))
