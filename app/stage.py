"""The approval app's registration with the core: the `app:` config section and the `mlops app` command."""

from __future__ import annotations


def register(stages) -> None:
    from app.config import AppConfig

    stages.add_section("app", AppConfig)
    stages.add_commands("app", "app.cli:install")
