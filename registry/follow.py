"""Layer 5 (readers): serving follows the registry: watch an alias and swap the served model when the ledger moves it.

The target is the ledger's word for the alias, never MLflow's alias alone: an alias moved behind the registry's
back (the MLflow UI's pencil icon) is refused and logged loudly, and serving stays where the ledger says. A new
version is loaded beside the old one, health-checked, then swapped in (`slot.load_and_swap`); in-flight requests
finish on the old model. Polling on every store; with a tracking server, MLflow's `model_version_alias.created`
webhook can wake the follower early (`poke()`).

With a canary route (`serving.canary.CanaryRoute`, the server's `app.state.canary`), the follower
also keeps the ledger's canary: when the replayed state names one (`canary_start`), its version is loaded into
the route's slot and takes its share of traffic; when it stops (`canary_stop`) or its `until` passes, the route
stops and the model is unloaded. A stage name that is no alias (`@candidate`) follows the newest version in that
stage, which is what `--shadow models:/<m>@candidate` means.
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
    canary: object | None = None  # serving_canary.CanaryRoute; None: canaries are not followed
    switches: list[Switch] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    canary_events: list[str] = field(default_factory=list)  # "started <v>", "stopped <v>", "failed <v>"
    clock: Callable[[], float] = time.time
    _canary_failed: tuple = ()  # (ledger seq, when) of a canary that did not load: retried after a minute
    _wake: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def target(self, state=None) -> str | None:
        """The verified ledger's version for the alias; logs loudly when MLflow's display alias disagrees."""
        from registry.audit import alias_drift
        from registry.resolve import target_of, verified_state

        state = state if state is not None else verified_state(self.model)
        if stage_alias(self.alias):  # no MLflow alias to compare with
            return target_of(state, self.alias)
        said = state.aliases.get(self.alias)
        if any(p.startswith(f"@{self.alias} ") for p in alias_drift(state)):
            self._loudly(f"MLflow's @{self.alias} of '{self.model}' differs from the ledger, which says "
                         f"{said or 'nothing'}: it was moved outside the registry. Serving stays on the ledger's "
                         f"version. Run `mlops registry verify {self.model}`.", "REFUSED ALIAS MOVE")
        return said

    def _loudly(self, message: str, kind: str) -> None:
        if not self.refusals or self.refusals[-1] != message:
            log.error("%s: %s", kind, message)
            self.refusals.append(message)

    def serving_version(self) -> str | None:
        current = getattr(self.slot, "current", None)
        return getattr(current, "version", None)

    def poll_once(self) -> Switch | None:
        """One look at the verified ledger. A chain that does not verify moves nothing: serving (and any canary)
        stays where the last verified ledger put it, and the refusal is logged and kept in `refusals`."""
        from registry.ledger import LedgerBroken
        from registry.resolve import verified_state

        try:
            state = verified_state(self.model)
        except LedgerBroken as err:
            self._loudly(f"{err} Still serving version {self.serving_version()}.", "LEDGER DOES NOT VERIFY")
            return None
        try:
            return self._follow(state)
        finally:
            if self.canary is not None:
                self._keep_canary(state)

    def _follow(self, state) -> Switch | None:
        target = self.target(state)
        previous = self.serving_version()
        if target is None or target == previous:
            return None
        noticed = time.monotonic()
        from mlops.errors import MLOpsError

        try:
            if stage_alias(self.alias):
                self._require_admissible(state, target)
            model = (self.materialize or _materialize)(f"models:/{self.model}/{target}")
        except MLOpsError as err:  # unverified bytes, code in the folder, failing gates: never loaded
            self._loudly(f"version {target} of '{self.model}' is not loaded: {err} Still serving version "
                         f"{previous}.", "REFUSED LOAD")
            return None
        self.slot.load_and_swap(model.hf_dir, model.profile(), target)
        switch = Switch(target, previous, noticed, time.monotonic())
        self.switches.append(switch)
        log.info("following %s@%s: now serving version %s (was %s), switched in %.2f s", self.model, self.alias,
                 target, previous or "nothing", switch.seconds)
        return switch

    def _require_admissible(self, state, version: str) -> None:
        """A candidate followed by stage (`--shadow ...@candidate`) is loaded only once its signed registration's
        lineage and its attested data gate pass: nobody reviewed it yet, so nothing less is put on a serving host."""
        from mlops.errors import MLOpsError
        from registry.gates import data_gate, lineage_gate

        vs = state.versions[version]
        for result in (lineage_gate(vs), data_gate(vs, state)):
            if not result.passed:
                raise MLOpsError(f"its {result.gate} gate does not pass ({result.detail}).")

    def attach(self, slot, canary=None) -> Follower:
        self.slot = slot
        if canary is not None:
            self.canary = canary
        return self

    def _keep_canary(self, state) -> None:
        """Load, re-share or stop the canary to match the ledger; a failure keeps the main model serving."""
        route, want = self.canary, state.canary
        if want and want.get("until") is not None and self.clock() >= float(want["until"]):
            want = None  # past its time: the controller should have stopped it; serving stops routing anyway
        if want and str(want["version"]) == self.serving_version():
            want = None  # the canary's version serves everyone already
        try:
            if want is None:
                if route.version is not None or route.slot.current is not None:
                    self.canary_events.append(f"stopped {route.version}")
                    route.stop()
                return
            version, share, until = str(want["version"]), float(want.get("share") or 0.0), want.get("until")
            until = float(until) if until is not None else None
            if route.version == version and route.slot.current is not None:
                if (route.share, route.until) != (share, until):
                    route.set(version, share, until)
                return
            seq = want.get("seq")
            if self._canary_failed and self._canary_failed[0] == seq and self.clock() - self._canary_failed[1] < 60:
                return
            model = (self.materialize or _materialize)(f"models:/{self.model}/{version}")
            route.slot.load_and_swap(model.hf_dir, model.profile(), version)
            route.set(version, share, until)
            self.canary_events.append(f"started {version}")
        except Exception as err:  # noqa: BLE001 - the canary stays off; the main model keeps serving
            self._canary_failed = (want.get("seq") if want else None, self.clock())
            self.canary_events.append(f"failed {want['version'] if want else route.version}")
            log.error("following %s: the canary could not be %s (%s: %s); all traffic stays on version %s",
                      self.model, "started" if want else "stopped", type(err).__name__, err, self.serving_version())

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


def stage_alias(alias: str) -> bool:
    """A stage name that is no governed alias (`candidate`): it names the newest version in that stage."""
    from registry.state import ALIAS_OF_STAGE, STAGES

    return alias in STAGES and alias not in ALIAS_OF_STAGE.values()


def _materialize(ref: str):
    from mlops.model_refs import materialize

    return materialize(ref)
