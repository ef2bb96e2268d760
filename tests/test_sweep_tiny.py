"""A real sweep on the tiny model through the training stage's own trainer: pruning, nested runs with full
lineage, a crashed and a diverged trial that do not stop the study, registration, and `mlflow run -e sweep`.
Slow: each trial is a real (short) DeepSpeed training run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlops.lineage import Tag
from training.engine import DIST_VARS
from training.sweep.testing import sweep_yaml
from training.testing import make_snapshot

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "train" / "tiny.yaml"
pytestmark = pytest.mark.slow
FAULTS = {
    "lr": {"key": "train.lr", "type": "float", "low": 1e-5, "high": 3e-2, "log": True},
    "crash": {"key": "train.debug.crash_after_step", "type": "categorical", "choices": [None, 3]},
    "nan": {"key": "train.debug.nan_at_step", "type": "categorical", "choices": [None, 3]},
}


def base_overrides(tiny_model: dict, snapshot: str, *extra: str) -> list[str]:
    return [f"base_model={tiny_model['path']}", f"train.snapshot={snapshot}", "train.max_steps=12",
            "train.eval_every=4", "train.checkpoint_every=4", "train.progress=false",
            "train.smoke.min_tokens_per_s=0", *extra]


def client():
    from mlflow import MlflowClient

    from mlops.tracking import tracking_uri

    return MlflowClient(tracking_uri=tracking_uri())


def nested(parent_id: str) -> dict:
    c = client()
    experiment = c.get_run(parent_id).info.experiment_id
    return {r.info.run_name: r for r in c.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_id}'")}


def test_tiny_sweep_prunes_nests_lineage_tagged_runs_and_survives_crashes(mlops_home, tmp_path, tiny_model,
                                                                         monkeypatch):
    from mlops.config import config_hash, validate_config
    from registry.testing import as_user, make_identities
    from registry.versions import version_tags
    from training.sweep.session import run_sweep

    make_identities()  # registering the best trial is a governed act: tina registers it
    for key, value in as_user("tina").items():
        monkeypatch.setenv(key, value)
    snapshot = make_snapshot()
    from registry.testing import data_run

    data_run("sweep-test", snapshot_id=snapshot)  # a tracked build of it: registration needs complete lineage
    good = {"crash": None, "nan": None}
    path = sweep_yaml(tmp_path / "sweep.yaml", base=TINY, base_overrides=base_overrides(tiny_model, snapshot),
                      study="tiny-e2e", params=FAULTS, pruner={"name": "median", "n_startup_trials": 1},
                      n_trials=5, heartbeat_interval=2,
                      enqueue=[{"lr": 1e-2, **good}, {"lr": 1e-5, **good}, {"lr": 5e-3, "crash": 3, "nan": None},
                               {"lr": 5e-3, "crash": None, "nan": 3}, {"lr": 8e-3, **good}])
    summary = run_sweep(path, [], register=True)

    states = [o.state for o in summary.outcomes]
    assert states[:4] == ["COMPLETE", "PRUNED", "FAIL", "FAIL"] and states[4] in ("COMPLETE", "PRUNED"), states
    assert "SimulatedCrash" in summary.outcomes[2].reason and "crash_after_step=3" in summary.outcomes[2].reason
    assert "non-finite loss" in summary.outcomes[3].reason

    runs = nested(summary.parent_run_id)
    assert {f"tiny-e2e-trial-{i}" for i in range(5)} | {"tiny-e2e-smoke"} == set(runs)
    for name, run in runs.items():
        tags = run.data.tags
        assert tags[Tag.PARENT_RUN] == summary.parent_run_id and tags[Tag.SNAPSHOT_ID] == snapshot
        assert tags[Tag.IMAGE_TAG] and tags[Tag.BASE_MODEL_ID] == tiny_model["id"] and tags[Tag.GIT_COMMIT]
        resolved = Path(client().download_artifacts(run.info.run_id, "config/resolved.yaml"))
        assert config_hash(validate_config(yaml.safe_load(resolved.read_text()))) == tags[Tag.CONFIG_HASH], name
    hashes = {runs[f"tiny-e2e-trial-{i}"].data.tags[Tag.CONFIG_HASH] for i in range(5)}
    assert len(hashes) == 5  # every trial trained its own config

    pruned = runs["tiny-e2e-trial-1"]
    assert pruned.data.tags[Tag.SWEEP_TRIAL_STATE] == "PRUNED" and "step 4" in pruned.data.tags[Tag.STOP_REASON]
    assert pruned.data.metrics["val_loss"] > runs["tiny-e2e-trial-0"].data.metrics["val_loss"]  # its last metrics
    for i, why in ((2, "SimulatedCrash"), (3, "non-finite loss")):
        failed = runs[f"tiny-e2e-trial-{i}"]
        assert failed.info.status == "FAILED" and failed.data.tags[Tag.SWEEP_TRIAL_STATE] == "FAIL"
        assert why in failed.data.tags[Tag.FAILURE_REASON]

    best = summary.best
    assert best["model_uri"] == f"runs:/{best['mlflow_run_id']}/model"
    assert summary.registered == "models:/tiny-e2e/1"
    tags = version_tags("tiny-e2e", "1")
    assert tags[Tag.SWEEP_STUDY] == "tiny-e2e" and tags[Tag.SWEEP_TRIAL] == str(best["number"])
    assert tags[Tag.CONFIG_HASH] == runs[f"tiny-e2e-trial-{best['number']}"].data.tags[Tag.CONFIG_HASH]
    from registry import ledger
    from registry.audit import model_state

    assert model_state("tiny-e2e").stage_of("1") == "candidate"  # through the registry's door: ledgered, no alias
    registered = [e for e in ledger.entries("tiny-e2e") if e.action == "register"]
    assert [(e.actor, e.evidence["run_id"]) for e in registered] == [("tina", best["mlflow_run_id"])]
    assert not client().get_registered_model("tiny-e2e").aliases

    # The CLI's door is the same one: as an identity, idempotent on the trial's run, and no alias.
    from registry.testing import as_user, run_cli

    code, out, err = run_cli("sweep", "best", "--study", "tiny-e2e", "--register", "--json", env=as_user("tina"))
    assert code == 0 and json.loads(out)["version"] == "1", err
    code, _, err = run_cli("sweep", "best", "--study", "tiny-e2e", "--register", "--alias", "production",
                           env=as_user("tina"))
    assert code == 2 and "moves no alias" in err
    assert len([e for e in ledger.entries("tiny-e2e") if e.action == "register"]) == 1


def test_mlflow_run_sweep_entry_point_nests_trials_under_the_projects_run(mlops_home, tmp_path, tiny_model):
    snapshot = make_snapshot()
    path = sweep_yaml(tmp_path / "sweep.yaml", base=TINY, study="entry", n_trials=8, heartbeat_interval=2,
                      pruner="none")
    uri = f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}"
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}  # an earlier in-process run set them
    env.update({"MLFLOW_TRACKING_URI": uri, "PATH": bin_dir + os.pathsep + os.environ["PATH"]})
    overrides = " ".join(base_overrides(tiny_model, snapshot, "train.final_model=false"))
    out = subprocess.run(
        [shutil.which("mlflow", path=env["PATH"]), "run", str(REPO / "mlproject"), "-e", "sweep",
         "--env-manager", "local", "--experiment-name", "sweep-entry", "-P", f"config={path}", "-P", "n_trials=2",
         "-P", f"overrides={overrides}"],
        capture_output=True, text=True, env=env, timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    c = client()
    experiment = c.get_experiment_by_name("sweep-entry")
    parents = [r for r in c.search_runs([experiment.experiment_id]) if r.data.tags.get(Tag.STAGE) == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    runs = nested(parents[0].info.run_id)
    assert {"entry-trial-0", "entry-trial-1", "entry-smoke"} == set(runs)  # n_trials "2.0" from MLflow -> 2
    assert parents[0].data.params["sweep.n_trials"] == "2"
    assert all(r.info.experiment_id == experiment.experiment_id for r in runs.values())
