"""CLI wrappers for serving, evaluation and gates."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `serve`, `eval` and `gate` to the top-level app."""
