"""A trial's heartbeat that cannot be recorded is logged (and recovers), never dropped in silence."""

from __future__ import annotations

import logging
import time


class FlakyStorage:
    """Fails the first two beats after the first, as a database outage would."""

    def __init__(self) -> None:
        self.calls = 0

    def record_heartbeat(self, trial_id: int) -> None:
        self.calls += 1
        if self.calls in (2, 3):
            raise ConnectionError("database unreachable")


def test_missed_heartbeats_are_logged_and_recovery_is_reported(caplog):
    from training.sweep.storage import Heartbeat

    storage = FlakyStorage()
    with caplog.at_level(logging.WARNING, logger="training.sweep.storage"):
        with Heartbeat(storage, 7, interval=0.05):
            deadline = time.monotonic() + 5
            while storage.calls < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
    text = caplog.text
    assert "trial 7: heartbeat 1 missed (ConnectionError: database unreachable)" in text
    assert "trial 7: heartbeat 2 missed" in text
    assert "trial 7: heartbeat recorded again after 2 missed beat(s)" in text
