"""Arrows and doors, held by walking the source: the registry imports only the core, and only its transition
module moves an MLflow alias or writes a governed tag."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("mlops", "registry", "training", "evaluation", "serving", "app", "scripts")
STAGES = {"training", "evaluation", "serving", "app"}
ALIAS_MOVES = {"set_registered_model_alias", "delete_registered_model_alias"}


def modules(*packages: str):
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imported(tree) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def calls_of(tree, names: set[str]) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in names]


def test_the_registry_imports_only_the_core():
    offenders = {str(p.relative_to(REPO)): sorted(imported(t) & STAGES) for p, t in modules("registry")}
    assert not {p: s for p, s in offenders.items() if s}


def test_the_core_imports_no_stage_and_not_the_registry():
    offenders = {str(p.relative_to(REPO)): sorted(imported(t) & (STAGES | {"registry"})) for p, t in modules("mlops")}
    assert not {p: s for p, s in offenders.items() if s}


def test_only_the_transition_module_moves_an_alias():
    # benchmarks/ and tests/ are left out on purpose: they measure the bare MLflow call and stage faults.
    movers = {str(p.relative_to(REPO)): calls_of(t, ALIAS_MOVES) for p, t in modules(*PACKAGES)}
    assert {p for p, lines in movers.items() if lines} == {"registry/transition.py"}


def test_only_the_transition_module_and_the_guarded_tagger_write_version_tags():
    writers = {str(p.relative_to(REPO)) for p, t in modules(*PACKAGES) if calls_of(t, {"set_model_version_tag"})}
    assert writers == {"registry/transition.py", "mlops/model_refs.py"}


def test_the_guarded_tagger_refuses_governed_tags():
    from mlops.errors import MLOpsError
    from mlops.model_refs import ModelDescription, set_version_tags

    version = ModelDescription("models:/bot/1", "version", "bot", "1")
    with pytest.raises(MLOpsError, match="written only by registry acts"):
        set_version_tags(version, {"registry.stage": "production"})
