"""Layer 1: the one error a refused act raises, whichever rule refused it."""

from __future__ import annotations

from mlops.errors import MLOpsError


class RefusedError(MLOpsError):
    """A transition the rules refuse; nothing was changed."""
