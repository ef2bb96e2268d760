"""Option types and config loading shared by every stage's CLI (the stages import these; the core owns them)."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file")
OverridesArg = typer.Argument(None, help="key=value overrides, e.g. train.lr=1e-4", show_default=False)


def split_overrides(overrides: list[str] | None) -> list[str]:
    """`mlflow run -P overrides="a=1 b=2"` arrives as one argument: split it, honouring quotes."""
    return [part for item in overrides or [] for part in shlex.split(item)]


def load(config: Path | None, overrides: list[str] | None):
    """The validated config from a YAML file plus `key=value` overrides (either may be absent)."""
    from mlops.config import load_config

    return load_config(config, split_overrides(overrides))
