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
        "for pkg in ('mlops', 'training', 'evaluation', 'registry', 'app'):\n"
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
