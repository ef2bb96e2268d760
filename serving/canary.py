"""Canary routing: while the registry runs a canary, a share of user generation requests goes to its version.

The canary version sits in a second `ModelSlot`; the registry follower (`registry.follow.Follower`, under
`mlops serve --follow`) loads it when the ledger's state names a canary and unloads it when the canary stops.
Which requests go there is a fresh server-side draw per request (`secrets.SystemRandom`), never anything the
client sends: a client choosing its `X-Request-ID` (or any other header) cannot pick, or avoid, the canary, and
the share holds whatever ids arrive. Requests routed here are labelled: `X-Model-Version` names the canary
version, the request log stores them with `role='canary'`, and `/metrics` counts them per version
(`mlops_serve_version_requests_total{role="canary"}`), which is what the canary controller reads. Past its
`until` the route takes no more traffic even before the follower notices the stop.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time

log = logging.getLogger("mlops.serve")


def sampled(request_id: str, share: float, salt: str) -> bool:
    """Deterministic share of request ids; different salts pick independent subsets. The shadow samples with it
    (a background copy, nothing the client receives); canary routing does not (see the module docstring)."""
    if share <= 0:
        return False
    if share >= 1:
        return True
    digest = hashlib.blake2b(f"{salt}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < share


class CanaryRoute:
    """A second slot and the share of traffic it takes; thread-safe."""

    def __init__(self, slot, metrics=None, clock=time.time, draw=None) -> None:
        self.slot = slot  # serving.slot.ModelSlot
        self.metrics = metrics
        self.clock = clock
        self.draw = draw or secrets.SystemRandom().random  # uniform in [0, 1); tests pass a seeded one
        self.version: str | None = None
        self.share = 0.0
        self.until: float | None = None
        self._lock = threading.Lock()

    def active(self) -> bool:
        return (self.version is not None and self.share > 0 and self.slot.current is not None
                and (self.until is None or self.clock() < self.until))

    def acquire(self):
        """The canary's serving when this request's draw falls in the share, else None (the caller uses the main
        slot). Takes nothing from the request on purpose. Every serving returned needs `self.slot.release`."""
        from serving.slot import SlotError

        if not self.active() or not (self.share >= 1 or self.draw() < self.share):
            return None
        try:
            return self.slot.acquire()
        except SlotError:  # stopped between the check and the lease
            return None

    def set(self, version: str, share: float, until: float | None) -> None:
        """Route `share` to `version`, which must already be loaded into `self.slot`."""
        with self._lock:
            if self.metrics is not None and self.version is not None and self.version != version:
                self.metrics.canary_share.remove(self.version)
            self.version, self.share, self.until = str(version), float(share), until
            if self.metrics is not None:
                self.metrics.canary_share.labels(self.version).set(self.share)
        log.info("canary: version %s takes %.0f%% of user requests%s", version, share * 100,
                 f" until {time.strftime('%H:%M:%S', time.localtime(until))}" if until else "")

    def stop(self) -> None:
        """No more traffic to the canary; its engine closes once its running requests finish."""
        with self._lock:
            version, self.version, self.share, self.until = self.version, None, 0.0, None
            if self.metrics is not None and version is not None:
                self.metrics.canary_share.remove(version)
        self.slot.unload()
        if version is not None:
            log.info("canary: version %s stopped; its model is unloaded once its requests finish", version)
