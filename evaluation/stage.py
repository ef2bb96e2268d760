"""Evaluation's registration with the core: the `eval:` config section and `eval`, `gate`, `contamination`, `shadow`, `monitor`, `loop`."""

from __future__ import annotations


def register(stages) -> None:
    from evaluation.config import EvalConfig

    stages.add_section("eval", EvalConfig)
    stages.add_commands("evaluation", "evaluation.cli:register")
    stages.add_commands("monitor", "evaluation.monitor_cli:install")
    stages.add_commands("loop", "evaluation.loop_cli:app")
