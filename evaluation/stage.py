"""Evaluation's registration with the core: the `eval:` config section and `serve`, `eval`, `gate`, `contamination`."""

from __future__ import annotations


def register(stages) -> None:
    from evaluation.config import EvalConfig
    from evaluation.serving_config import ServeConfig

    stages.add_section("eval", EvalConfig)
    stages.add_section("serve", ServeConfig)
    stages.add_commands("evaluation", "evaluation.cli:register")
