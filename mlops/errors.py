"""User-facing errors.

Every error a user can cause derives from `MLOpsError`; the CLI prints its message as one paragraph and
exits non-zero without a traceback. Messages name the problem, the offending value and the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class MLOpsError(Exception):
    """An error caused by input or environment, with a message that says how to fix it."""

    exit_code = 2


class ConfigError(MLOpsError):
    """The configuration is malformed or invalid."""


class StrictModeError(MLOpsError):
    """A release run was refused because its provenance is not reproducible."""


class TrackingError(MLOpsError):
    """The tracking backend cannot be used."""


class NotFoundError(MLOpsError):
    """A named thing (model, snapshot, suite, ...) does not exist."""


class WorkerDied(MLOpsError):
    """A worker process died (killed by the OS, out of memory, a crash in native code)."""


class AlreadyInForce(MLOpsError):
    """The act asked for is already in force (the version already holds the alias); nothing was written.

    Its own exit status, so a script tells "someone did it before" (4) from "done now" (0) and "refused" (2).
    `facts` (model, version, alias, ...) go into the `--json` answer."""

    exit_code = 4

    def __init__(self, message: str, **facts: str | None) -> None:
        super().__init__(message)
        self.facts = facts


def did_you_mean(name: str, available: Iterable[str]) -> str:
    """'did you mean X? available: a, b, c' for an unknown name."""
    options = sorted(available)
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"{hint}available: {', '.join(options) if options else '(none)'}"
