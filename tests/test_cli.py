"""The `mlops` CLI as a user meets it: help, one-paragraph errors, and the smoke stage end to end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlops.lineage import Tag

REPO = Path(__file__).resolve().parent.parent
LINEAGE = {Tag.CONFIG_HASH, Tag.IMAGE_TAG, Tag.IMAGE_TAG_MUTABLE, Tag.GIT_COMMIT, Tag.GIT_DIRTY,
           Tag.CODE_VERSION, Tag.SEED, Tag.BASE_MODEL, Tag.BASE_MODEL_ID}


def mlops(*args, env=None, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlops", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout)


def test_help_lists_the_stages():
    out = mlops("--help")
    assert out.returncode == 0
    for stage in ("base-model", "smoke", "data", "train", "config"):
        assert stage in out.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["config", "show", "train.lrr=1"], "did you mean 'lr'"),
        (["config", "show", "train.lr=abc"], "train.lr"),
        (["smoke", "--base-model", "smollm", "--max-new-tokens", "2"], "did you mean 'smollm2'"),
    ],
)
def test_bad_input_gets_one_paragraph_error_without_traceback(args, expected, mlops_home):
    out = mlops(*args)
    assert out.returncode == 2
    assert expected in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: ") and out.stderr.strip().count("\n") == 0


def test_broken_yaml_file_gets_one_paragraph_error(tmp_path, mlops_home):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [\n")
    out = mlops("config", "show", "--config", str(bad))
    assert out.returncode == 2 and "not valid YAML" in out.stderr and "Traceback" not in out.stderr


def test_unreachable_tracking_uri_fails_before_work_and_writes_nothing(tiny_model, mlops_home):
    out = mlops("smoke", "--base-model", tiny_model["path"], env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert out.returncode == 2 and "unreachable" in out.stderr and "Traceback" not in out.stderr
    assert not (mlops_home / ".mlops" / "mlflow.db").exists()


def test_config_show_prints_resolved_config_and_hash(mlops_home):
    out = mlops("config", "show", "train.lr=0.001")
    assert out.returncode == 0 and "lr: 0.001" in out.stdout and "# config hash: " in out.stdout


def test_smoke_logs_generation_with_every_lineage_tag(tiny_model, mlops_home):
    from mlflow.tracking import MlflowClient

    from mlops.config import load_config
    from mlops.smoke import run_smoke
    from mlops.tracking import tracking_uri

    cfg = load_config(None, [f"base_model={tiny_model['path']}"])
    run_id, generation = run_smoke(cfg, "Hello?", max_new_tokens=4)
    run = MlflowClient(tracking_uri=tracking_uri()).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert LINEAGE <= set(run.data.tags) and run.data.tags[Tag.BASE_MODEL_ID] == tiny_model["id"]
    assert generation.new_tokens >= 1
    local = MlflowClient(tracking_uri=tracking_uri()).download_artifacts(run_id, "smoke/generation.json")
    assert '"prompt": "Hello?"' in Path(local).read_text()


@pytest.mark.slow
def test_mlflow_run_smoke_entry_point(tiny_model, mlops_home):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{mlops_home / 'mlflow.db'}"
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    mlflow = shutil.which("mlflow", path=env["PATH"])
    out = subprocess.run(
        [mlflow, "run", str(REPO / "mlproject"), "-e", "smoke", "--env-manager", "local",
         "-P", f"base_model={tiny_model['path']}", "-P", "max_new_tokens=3", "--experiment-name", "smoke-e2e"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("smoke-e2e").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert LINEAGE <= set(runs[0].data.tags)
