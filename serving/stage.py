"""Serving's registration with the core: the `serve:` config section and `serve`, `serve-keys`."""

from __future__ import annotations


def register(stages) -> None:
    from serving.config import ServeConfig

    stages.add_section("serve", ServeConfig)
    stages.add_commands("serving", "serving.cli:register")
    stages.add_service("spot_check_answers", "serving.spot_answers:served_answers")
