"""Serving follows the registry: watch an alias and swap the served model when the ledger moves it.

The target is the ledger's word for the alias, never MLflow's alias alone: an alias moved behind the registry's
back (the MLflow UI's pencil icon) is refused and logged loudly, and serving stays where the ledger says. A new
version is loaded beside the old one, health-checked, then swapped in (`slot.load_and_swap`); in-flight requests
finish on the old model. Polling on every store; with a tracking server, MLflow's `model_version_alias.created`
webhook can wake the follower early (`poke()`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class Switch:
    version: str
    previous: str | None
    noticed_at: float  # when the follower saw the ledger's new target
    switched_at: float  # when the new model took requests

    @property
    def seconds(self) -> float:
        return self.switched_at - self.noticed_at


@dataclass
class Follower:
    """Keeps `slot` on the version the ledger names for `model@alias`."""

    model: str
    alias: str
    slot: object  # has load_and_swap(model_dir, profile, version) and .current.version
    interval: float = 1.0
    materialize: Callable | None = None  # ref -> ResolvedModel (tests inject a fake)
    switches: list[Switch] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    _wake: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def target(self) -> str | None:
        """The ledger's version for the alias; logs loudly when MLflow's alias disagrees."""
        from registry.audit import model_state
        from registry.transition import registry_aliases

        said = model_state(self.model).aliases.get(self.alias)
        actual = registry_aliases(self.model).get(self.alias)
        if actual != said:
            message = (f"@{self.alias} of '{self.model}' points to {actual or 'nothing'} in MLflow but the ledger "
                       f"says {said or 'nothing'}: it was moved outside the registry. Serving stays on the ledger's "
                       f"version. Run `mlops registry verify {self.model}`.")
            if not self.refusals or self.refusals[-1] != message:
                log.error("REFUSED ALIAS MOVE: %s", message)
                self.refusals.append(message)
        return said

    def serving_version(self) -> str | None:
        current = getattr(self.slot, "current", None)
        return getattr(current, "version", None)

    def poll_once(self) -> Switch | None:
        target = self.target()
        previous = self.serving_version()
        if target is None or target == previous:
            return None
        noticed = time.monotonic()
        ref = f"models:/{self.model}/{target}"
        materialize = self.materialize or _materialize
        model = materialize(ref)
        self.slot.load_and_swap(model.hf_dir, model.profile(), target)
        switch = Switch(target, previous, noticed, time.monotonic())
        self.switches.append(switch)
        log.info("following %s@%s: now serving version %s (was %s), switched in %.2f s", self.model, self.alias,
                 target, previous or "nothing", switch.seconds)
        return switch

    def attach(self, slot) -> Follower:
        self.slot = slot
        return self

    def poke(self) -> None:
        """Check now (a registry webhook arrived) instead of at the next interval."""
        self._wake.set()

    def start(self) -> Follower:
        self._thread = threading.Thread(target=self._loop, name=f"follow-{self.model}@{self.alias}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as err:  # noqa: BLE001 - keep serving the current model; try again next interval
                log.error("following %s@%s: could not switch (%s: %s); still serving version %s", self.model,
                          self.alias, type(err).__name__, err, self.serving_version())
            self._wake.wait(self.interval)
            self._wake.clear()


def _materialize(ref: str):
    from mlops.model_refs import materialize

    return materialize(ref)
