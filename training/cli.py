"""CLI wrapper for this stage."""

from __future__ import annotations

import typer

app = typer.Typer(help="(stage under construction)", no_args_is_help=True)
