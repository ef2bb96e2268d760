"""Training's registration with the core: the `train:` and `sweep:` config sections and the `train`/`sweep` CLIs."""

from __future__ import annotations


def register(stages) -> None:
    from training.config import TrainConfig
    from training.sweep.config import SweepConfig

    stages.add_section("train", TrainConfig)
    stages.add_section("sweep", SweepConfig)
    stages.add_commands("train", "training.cli:app")
    stages.add_commands("sweep", "training.sweep_cli:app")
    stages.add_commands("usage", "training.usage_cli:app")
