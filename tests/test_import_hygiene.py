"""House rule: no work at import time, and the CLI starts without heavy packages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ["torch", "mlflow", "transformers", "deepspeed", "great_expectations", "lm_eval", "streamlit", "optuna"]


def run_python(code: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLOPS_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_cli_with_every_stage_registered_imports_no_heavy_package(tmp_path):
    code = (
        "import sys, mlops.cli\n"
        "mlops.cli._register_stages()\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = run_python(code, tmp_path, tmp_path / "home")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_importing_every_module_writes_nothing(tmp_path):
    code = (
        "import importlib, pkgutil\n"
        "for pkg in ('mlops', 'training', 'evaluation', 'serving', 'registry', 'app'):\n"
        "    module = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(module.__path__, pkg + '.'):\n"
        "        if info.name.endswith('__main__') or info.name.startswith('app.'):\n"
        "            continue  # entry scripts run on import by design\n"
        "        importlib.import_module(info.name)\n"
    )
    home = tmp_path / "home"
    out = run_python(code, tmp_path, home)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [p.name for p in tmp_path.iterdir()] == []


STAGES = ("training", "evaluation", "serving", "registry", "app")
COMPOSITION_ROOTS = {"mlops/cli.py", "mlops/__main__.py"}


def stage_imports(source: str) -> list[str]:
    """Stage packages a module imports (top-level or inside functions), by walking its AST."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [n for n in names if n.split(".")[0] in STAGES]
    return found


def test_core_modules_import_no_stage():
    offenders = {}
    for path in sorted((REPO / "mlops").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in COMPOSITION_ROOTS:
            continue
        if imports := stage_imports(path.read_text(encoding="utf-8")):
            offenders[rel] = imports
    assert offenders == {}, f"core modules import stages (arrows must point down): {offenders}"


def test_import_direction_check_catches_a_function_level_stage_import():
    source = "def f():\n    from evaluation.profile import load_profile\n    import training.engine\n"
    assert stage_imports(source) == ["evaluation.profile", "training.engine"]
    assert stage_imports("from mlops.profile import load_profile\nimport trainingwheels\n") == []


def test_production_code_imports_no_test_fakes():
    fakes = {"training.testing", "training.sweep.testing", "mlops.data.testing", "serving.testing"}
    offenders = {}
    for pkg in ("mlops", "training", "evaluation", "serving", "registry", "app"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            if path.name == "testing.py":
                continue
            import ast

            tree = ast.parse(path.read_text(encoding="utf-8"))
            used = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module in fakes]
            if used:
                offenders[path.relative_to(REPO).as_posix()] = used
    assert offenders == {}, f"production modules import test fakes: {offenders}"


def imported_modules(source: str) -> list[str]:
    """Every module a source imports (top level or inside functions), by walking its AST."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return found


def test_the_api_layer_depends_on_the_engine_contract_only():
    """serving/ outside serving/engines/ names engines by their registered name, never by their module."""
    offenders = {}
    for path in sorted((REPO / "serving").glob("*.py")):
        engines = [m for m in imported_modules(path.read_text(encoding="utf-8"))
                   if m == "serving.engines" or m.startswith("serving.engines.")]
        # the contract loads the built-in registrations lazily; the CLI is the composition root (`release package`
        # drives llama.cpp's own converter), not the API layer
        if engines and path.name not in ("engine.py", "cli.py"):
            offenders[path.relative_to(REPO).as_posix()] = engines
    assert offenders == {}, f"API modules import engine modules: {offenders}"


def test_evaluation_holds_no_engine_code():
    """Evaluation reaches models through the served endpoint (lm-eval's API client), never an engine module."""
    heavy = {"llama_cpp", "vllm"}
    offenders = {}
    for path in sorted((REPO / "evaluation").rglob("*.py")):
        used = [m for m in imported_modules(path.read_text(encoding="utf-8"))
                if m.startswith("serving.engines") or m.split(".")[0] in heavy]
        if used:
            offenders[path.relative_to(REPO).as_posix()] = used
    assert offenders == {}, f"evaluation modules run models themselves: {offenders}"


def test_the_engine_walk_catches_a_function_level_engine_import():
    source = "def f():\n    from serving.engines.hf.engine import Engine\n    import llama_cpp\n"
    assert "serving.engines.hf.engine" in imported_modules(source) and "llama_cpp" in imported_modules(source)
