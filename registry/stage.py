"""The registry's registration with the core: the `mlops registry` CLI."""

from __future__ import annotations


def register(stages) -> None:
    stages.add_commands("registry", "registry.cli:app")
