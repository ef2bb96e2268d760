"""`mlops data ...` as a user meets it, and the `data` MLflow entry point end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlops.data.format import write_snapshot
from mlops.lineage import Tag

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "configs" / "data" / "sample.yaml"


def mlops(*args, cwd=None, timeout=600, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlops", "data", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, **(env or {})})


def test_show_verify_and_errors_without_traceback(mlops_home):
    folder = write_snapshot({"train": [[5, 6, 7], [8, 9]]}, seq_len=8)
    out = mlops("show", folder.name)
    assert out.returncode == 0 and folder.name in out.stdout
    assert mlops("verify", folder.name).returncode == 0
    (folder / "train" / "shard-00000.input_ids.npy").write_bytes(b"tampered")
    bad = mlops("verify", folder.name)
    assert bad.returncode == 2 and "shard-00000.input_ids.npy' changed" in bad.stderr
    assert "Traceback" not in bad.stderr
    missing = mlops("show", folder.name[:-2] + "zz")
    assert missing.returncode == 2 and f"did you mean '{folder.name}'" in missing.stderr
    config = mlops("build", "--config", str(SAMPLE), "data.batch_sise=3")
    assert config.returncode == 2 and "did you mean 'batch_size'" in config.stderr
    typo = mlops("build", "--config", str(SAMPLE), "data.workers=2", "data.pii.types=[email,phnoe]")
    assert typo.returncode == 2 and "did you mean 'phone'" in typo.stderr and "data.pii.types" in typo.stderr
    assert "Traceback" not in typo.stderr and "BrokenProcessPool" not in typo.stderr


@pytest.mark.slow
def test_verify_advice_is_a_command_that_repairs_the_snapshot(mlops_home, tiny_model):
    from mlops.data.labelled_dedup import conversations
    from mlops.data.testing import quick_build

    built = quick_build(conversations(24, seed=5), base_model=tiny_model["path"], workdir=mlops_home)
    (built.path / "train" / "shard-00000.loss_mask.npy").write_bytes(b"damaged")
    bad = mlops("verify", built.snapshot_id, cwd=mlops_home)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    advice = bad.stderr.split("`")[1]
    assert advice == f"mlops data rebuild {built.snapshot_id}"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}"}
    fixed = mlops(*advice.split()[2:], cwd=mlops_home, env=env)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert f"snapshot {built.snapshot_id}: built" in fixed.stdout
    assert mlops("verify", built.snapshot_id, cwd=mlops_home).returncode == 0


@pytest.mark.slow
def test_sample_data_builds_through_the_cli_and_mlflow_entry_point(mlops_home, tiny_model):
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    assert mlops("sample", "--out", "data/generated", cwd=mlops_home, env=env).returncode == 0
    overrides = f"base_model={tiny_model['path']} data.workers=2"
    out = subprocess.run(
        [str(Path(sys.executable).parent / "mlflow"), "run", str(REPO / "mlproject"), "-e", "data", "--env-manager",
         "local", "--experiment-name", "data", "-P", f"config={SAMPLE}", "-P", f"overrides={overrides}"],
        capture_output=True, text=True, cwd=mlops_home, timeout=900, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    snapshot_id = next(line.split()[1].rstrip(":") for line in out.stdout.splitlines() if line.startswith("snapshot "))

    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("data").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.tags[str(Tag.SNAPSHOT_ID)] == snapshot_id and run.data.tags[str(Tag.STAGE)] == "data"
    assert run.data.tags[str(Tag.CONFIG_HASH)] and run.data.metrics["gate.batches_quarantined"] == 0
    assert run.data.metrics["record.too_many_tokens"] >= 1  # the token-dense records cost only themselves
    assert run.inputs.dataset_inputs[0].dataset.digest == snapshot_id[:36]
    logged = [a.path for a in client.list_artifacts(run.info.run_id, "snapshot")]
    assert "snapshot/manifest.json" in logged  # plus snapshot/gate/ when a batch was refused (its GE results)
    assert set(logged) <= {"snapshot/manifest.json", "snapshot/gate"}

    manifest = json.loads((mlops_home / ".mlops" / "snapshots" / snapshot_id / "manifest.json").read_text())
    c = manifest["counters"]
    for key in ("pii.email", "pii.credit_card", "pii.phone", "dedup.exact", "dedup.near", "decontam.eval_overlap",
                "filter.too_long", "filter.symbol_ratio", "bad_input.malformed_json", "bad_input.not_utf8"):
        assert c[key] > 0, key
    shown = mlops("show", snapshot_id, cwd=mlops_home)
    assert "record.too_many_tokens" in shown.stdout and "[malformed_json]" in shown.stdout
    again = mlops("build", "--config", str(SAMPLE), *overrides.split(), cwd=mlops_home, env=env)
    assert again.returncode == 0 and f"snapshot {snapshot_id}: already built (no work done)" in again.stdout
    assert mlops("verify", snapshot_id, cwd=mlops_home).returncode == 0
