"""The stage registry the core owns: config sections and CLI command groups, added by the stages themselves.

Arrows point down: the core never imports a stage. Each stage package declares one entry point in the
`mlops.stages` group (see pyproject.toml) naming a `register(stages)` function; `load_stages()` calls each once,
and the stage adds its config section models and its CLI commands here. The config tree (`mlops.config`) and
the composition root (`mlops.cli.main`) read what was registered.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlops.errors import MLOpsError

ENTRY_POINT_GROUP = "mlops.stages"


@dataclass
class StageRegistry:
    """What the stages registered: `sections` (config key -> pydantic model) and `commands` (name -> installer).

    A command installer is a "module:attr" path of a Typer app (added as a sub-command group named `name`) or
    of a function `install(app)` that adds top-level commands; it is resolved only when the CLI is built, so
    loading a config never imports a CLI module.
    """

    sections: dict[str, type] = field(default_factory=dict)
    commands: dict[str, str] = field(default_factory=dict)
    services: dict[str, str] = field(default_factory=dict)
    stages: list[str] = field(default_factory=list)

    def add_section(self, name: str, model: type) -> None:
        if name in self.sections and self.sections[name] is not model:
            raise ValueError(f"config section '{name}' is registered twice")
        self.sections[name] = model

    def add_commands(self, name: str, target: str) -> None:
        if name in self.commands and self.commands[name] != target:
            raise ValueError(f"command group '{name}' is registered twice")
        self.commands[name] = target

    def add_service(self, name: str, target: str) -> None:
        """A function the core calls without importing its stage ("module:attr"), e.g. the registry's
        `authenticate` and `release_version`: the rule stays in its stage, the core only asks."""
        if name in self.services and self.services[name] != target:
            raise ValueError(f"service '{name}' is registered twice")
        self.services[name] = target


_REGISTRY: StageRegistry | None = None


def _entry_points() -> list[tuple[str, Callable[[StageRegistry], Any]]]:
    from importlib.metadata import entry_points

    return [(ep.name, ep.load) for ep in entry_points(group=ENTRY_POINT_GROUP)]


def load_stages() -> StageRegistry:
    """Every installed stage, registered once per process."""
    global _REGISTRY
    if _REGISTRY is not None:
        return _REGISTRY
    registry = StageRegistry()
    found = _entry_points()
    if not found:
        raise MLOpsError(
            f"no stage is installed (no '{ENTRY_POINT_GROUP}' entry points). "
            "Fix: install the project with `pip install -e .` (make install does), which declares them."
        )
    for name, load in sorted(found):
        load()(registry)
        registry.stages.append(name)
    _REGISTRY = registry
    return registry


def resolve(target: str) -> Any:
    """The object at 'module:attr'."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def service(name: str) -> Callable | None:
    """The function a stage registered as `name`, or None when no installed stage provides it."""
    target = load_stages().services.get(name)
    return resolve(target) if target else None
