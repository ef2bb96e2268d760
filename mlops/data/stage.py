"""The data stage's registration with the core: the `data:` config section and the `mlops data` CLI."""

from __future__ import annotations


def register(stages) -> None:
    from mlops.data.config import DataConfig

    stages.add_section("data", DataConfig)
    stages.add_commands("data", "mlops.data.cli:app")
