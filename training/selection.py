"""Best-checkpoint selection and early stopping (`train.select`): a pure rule over the run's evaluations.

Every evaluation of the chosen metric either improves on the best so far by more than `min_delta` (the trainer
then saves a checkpoint at that step, so the best is always a checkpoint on disk) or counts against `patience`.
The rule's state travels in every checkpoint's client state, so a run resumed after a kill replays the same
evaluations from the same state: it selects the same best and stops at the same step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Verdict:
    improved: bool  # this evaluation is the new best: save a checkpoint at this step
    stop: str | None = None  # why the run ends here (early stopping), or None


@dataclass
class Selection:
    metric: str | None  # None: the last checkpoint is the final model, nothing is stopped early
    mode: str = "min"
    patience: int | None = None
    min_delta: float = 0.0
    best_step: int | None = None
    best_value: float | None = None
    since_best: int = 0  # evaluations since the best without an improvement
    stopped: str | None = None  # the early-stop reason once the rule fired (a resume must not train on)
    history: list[tuple[int, float]] = field(default_factory=list)

    @classmethod
    def from_config(cls, section) -> Selection:
        return cls(section.metric, section.resolved_mode(), section.patience, section.min_delta)

    @property
    def active(self) -> bool:
        return self.metric is not None

    @property
    def label(self) -> str:
        return f"{self.metric} {self.mode}"

    def better(self, value: float) -> bool:
        if not math.isfinite(value):
            return False  # a NaN score never becomes the release candidate
        if self.best_value is None:
            return True
        if self.mode == "min":
            return value < self.best_value - self.min_delta
        return value > self.best_value + self.min_delta

    def observe(self, step: int, measured: dict[str, float]) -> Verdict | None:
        """Apply one step's measurements; None when the metric was not measured at this step."""
        if not self.active or self.metric not in measured or self.stopped:
            return None
        value = float(measured[self.metric])
        self.history.append((step, value))
        if self.better(value):
            self.best_step, self.best_value, self.since_best = step, value, 0
            return Verdict(improved=True)
        self.since_best += 1
        if self.patience is not None and self.since_best >= self.patience:
            self.stopped = (
                f"early stopping at step {step}: {self.metric} has not improved by more than {self.min_delta:g} "
                f"({self.mode}) for {self.since_best} evaluations (train.select.patience={self.patience}); the best "
                f"was {self.best_value:.6g} at step {self.best_step}"
            )
            return Verdict(improved=False, stop=self.stopped)
        return Verdict(improved=False)

    # ------------------------------------------------------------ checkpoint state

    def state(self) -> dict:
        return {"metric": self.metric, "mode": self.mode, "best_step": self.best_step, "best_value": self.best_value,
                "since_best": self.since_best, "stopped": self.stopped, "history": [list(h) for h in self.history]}

    def restore(self, state: dict | None) -> None:
        """Take over a checkpoint's state when it judged the same metric the same way (else start afresh: a
        resume that changed the metric judges only the evaluations it sees)."""
        if not state or state.get("metric") != self.metric or state.get("mode") != self.mode:
            return
        self.best_step, self.best_value = state.get("best_step"), state.get("best_value")
        self.since_best = int(state.get("since_best") or 0)
        self.stopped = state.get("stopped")
        self.history = [(int(s), float(v)) for s, v in state.get("history") or []]

    def summary(self) -> dict:
        """What the run, the final model's manifest and the registered version say about the choice."""
        return {"metric": self.metric, "mode": self.mode, "step": self.best_step, "value": self.best_value,
                "early_stopped": self.stopped}
