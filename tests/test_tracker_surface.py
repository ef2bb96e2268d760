"""Every tracker that stands in for the MLflow one answers every call the trainer can make on it."""

from __future__ import annotations

import inspect

import pytest

from mlops.tracking import MemoryTracker, MlflowTracker
from training.metrics import NullTracker


def public_methods(cls) -> set[str]:
    return {name for name, member in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


@pytest.mark.parametrize("stand_in", [NullTracker, MemoryTracker])
def test_a_stand_in_tracker_answers_every_call_the_mlflow_tracker_answers(stand_in):
    # Ranks other than 0 log to NullTracker: a method it lacks crashes that rank alone (a resumed two-process
    # run once hung on exactly this), so the surfaces must match, whatever is added to the MLflow tracker.
    needed = public_methods(MlflowTracker) - {"start", "existing", "status"}
    assert needed - public_methods(stand_in) == set()
