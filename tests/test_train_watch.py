"""Runs that watch themselves (issue 41): the smoke rule (training.smoke_rule: a run planned above
train.smoke.required_above_hours starts only after a passed smoke run of the same config, or with a recorded
reason), and MLflow's system metrics on every training run."""

from __future__ import annotations

import pytest

from mlops.errors import ConfigError


def run_training(cfg, smoke: bool = False) -> dict:
    """`mlops train run` in this process (prepare, then train on the MLflow store), several times per process."""
    from training.prepare import prepare
    from training.trainer import train

    return train(cfg, prepared=prepare(cfg, 1, smoke=smoke)).as_dict()


LONG = {"train.smoke.required_above_hours": 1e-9, "train.smoke.steps": 4, "train.smoke.min_tokens_per_s": 0,
        "train.smoke.min_loss_drop": 0, "train.final_model": False, "train.max_steps": 4}


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_a_long_run_is_refused_until_a_smoke_of_its_config_passed(make_train_cfg, tmp_path):
    from mlops.run_store import get_run
    from training.smoke_rule import SMOKE_OF

    with pytest.raises(ConfigError, match=r"above train.smoke.required_above_hours.*--smoke true.*skip_reason"):
        run_training(make_train_cfg("a", **LONG))
    assert not (tmp_path / "a").exists()  # nothing started: no folder, no checkpoint
    other = run_training(make_train_cfg("a", **LONG, **{"train.lr": 5e-4}), smoke=True)  # a smoke of another config
    assert other["status"] == "FINISHED"
    with pytest.raises(ConfigError, match="no smoke run of its config"):
        run_training(make_train_cfg("a", **LONG))
    smoke = run_training(make_train_cfg("a", **LONG), smoke=True)
    real = run_training(make_train_cfg("a", **LONG))
    assert real["status"] == "FINISHED" and real["steps"] == 4
    assert get_run(smoke["run_id"]).data.tags[SMOKE_OF] == get_run(real["run_id"]).data.tags["mlops.config_hash"]


def test_a_skip_reason_starts_a_long_run_and_is_recorded_on_it(make_train_cfg):
    from mlops.run_store import get_run
    from training.smoke_rule import SMOKE_SKIPPED

    real = run_training(make_train_cfg("b", **LONG, **{"train.smoke.skip_reason": "hotfix, data unchanged"}))
    assert get_run(real["run_id"]).data.tags[SMOKE_SKIPPED] == "hotfix, data unchanged"


def test_a_short_run_needs_no_smoke(make_train_cfg):

    assert run_training(make_train_cfg("c", **{**LONG, "train.smoke.required_above_hours": 1000}))["status"] == "FINISHED"


def test_training_runs_carry_mlflows_system_metrics(make_train_cfg):
    from mlops.run_store import get_run

    result = run_training(make_train_cfg("d", **{"train.system_metrics_seconds": 1, "train.max_steps": 6,
                                               "train.final_model": False}))
    metrics = get_run(result["run_id"]).data.metrics
    assert "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_a_cli_training_logs_from_all_its_threads_without_starving_the_store_pool(mlops_home, tiny_model):
    """The step loop, the heartbeat, MLflow's system-metrics monitor and the checkpoint finalizer write to the store
    at once; the CLI's bounded pool must leave them room, or each waits out the pool's 30 s timeout."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    from training.testing import make_snapshot

    env = {**os.environ, "MLOPS_HOME": str(mlops_home), "OMP_NUM_THREADS": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}"}
    env.pop("MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW", None)  # the CLI's own bound, as a user gets it
    args = [f"base_model={tiny_model['path']}", f"train.snapshot={make_snapshot()}", "train.max_steps=12",
            "train.checkpoint_every=2", "train.eval_every=2", "train.heartbeat_seconds=1",
            "train.system_metrics_seconds=1", "train.progress=false", "train.final_model=false", "run.log_every=1"]
    done = subprocess.run([sys.executable, "-m", "mlops", "train", "run", "--config", "configs/train/tiny.yaml", *args],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "QueuePool limit" not in output and "Failed to log run data" not in output, output[-4000:]
