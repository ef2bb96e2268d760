"""Many workers, one PostgreSQL study, through the real CLI: `mlops sweep run` plus `mlops sweep worker` share
the queue without running a trial twice, and a worker killed with SIGKILL leaves its trial FAILED by heartbeat.
Slow: separate Python processes training the tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlops.lineage import Tag
from training.engine import DIST_VARS
from training.sweep.testing import sweep_yaml
from training.testing import make_snapshot

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "train" / "tiny.yaml"
pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def env(mlops_home):
    bin_dir = str(Path(sys.executable).parent)
    clean = {k: v for k, v in os.environ.items() if k not in DIST_VARS}  # set by earlier in-process runs
    return {**clean, "OMP_NUM_THREADS": "1", "MLOPS_HOME": str(mlops_home),
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "MLFLOW_TRACKING_URI": f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}"}


def config(tmp_path: Path, tiny_model: dict, study: str, *extra: str, **sweep) -> Path:
    overrides = [f"base_model={tiny_model['path']}", f"train.snapshot={make_snapshot()}", "train.eval_every=4",
                 "train.checkpoint_every=4", "train.progress=false", "train.final_model=false",
                 "train.smoke.min_tokens_per_s=0", *extra]  # a busy test machine must not fail the smoke check
    return sweep_yaml(tmp_path / f"{study}.yaml", base=TINY, base_overrides=overrides, study=study,
                      space="lr", params={}, pruner="none", **sweep)


def mlops(env, *args, **popen) -> subprocess.Popen:
    """`mlops sweep ...` in the background, its output in a file (a full pipe would stall it)."""
    log = Path(env["MLOPS_HOME"]) / f"sweep-{args[0]}-{time.monotonic_ns()}.log"
    proc = subprocess.Popen([sys.executable, "-m", "mlops", "sweep", *args], env=env, cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, **popen)
    proc.log = log
    return proc


def finish(*procs: subprocess.Popen, timeout: float = 1500) -> list[str]:
    """Wait for every process; the first one that fails stops the others and fails the test with its output."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            raise AssertionError(f"{failed[0].args} failed:\n{failed[0].log.read_text()[-6000:]}")
        time.sleep(1)
    outs = []
    for p in procs:
        p.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert p.returncode == 0, f"{p.args} failed:\n{p.log.read_text()[-6000:]}"
        outs.append(p.log.read_text())
    return outs


def status(env, study: str, url: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "mlops", "sweep", "status", "--study", study, "--storage", url,
                          "--json"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout[out.stdout.index("{"):])


def test_two_worker_processes_share_one_postgres_study(env, tmp_path, tiny_model, postgres_url):
    plain_url = postgres_url.replace("postgresql+psycopg://", "postgresql://")  # as users type it
    path = config(tmp_path, tiny_model, "shared", "train.max_steps=8", n_trials=6, heartbeat_interval=2)
    coordinator = mlops(env, "run", "--config", str(path), "--storage", plain_url)
    worker = mlops(env, "worker", "--study", "shared", "--storage", plain_url, "--wait", "900")
    worker_out, coordinator_out = finish(worker, coordinator)

    info = status(env, "shared", plain_url)
    trials = info["trials"]
    assert info["counts"] == {"COMPLETE": 6} and sorted(t["number"] for t in trials) == list(range(6))
    runs = [t["mlflow_run_id"] for t in trials]
    assert len(set(runs)) == 6 and len({t["config_hash"] for t in trials}) == 6
    ran_by_worker = {int(n) for n in _numbers(worker_out)}
    ran_by_coordinator = {int(n) for n in _numbers(coordinator_out)}
    assert ran_by_worker and ran_by_coordinator and not ran_by_worker & ran_by_coordinator
    assert ran_by_worker | ran_by_coordinator == set(range(6))
    assert len({t["worker"] for t in trials}) == 2  # two processes, as recorded in the study

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    for run_id in runs:
        assert client.get_run(run_id).data.tags[Tag.PARENT_RUN] == info["parent_run_id"]


def _numbers(output: str) -> list[str]:
    return [line.split()[1].rstrip(":") for line in output.splitlines() if line.startswith("trial ")]


def test_killed_worker_leaves_its_trial_failed_by_heartbeat_not_running(env, tmp_path, tiny_model, postgres_url):
    import optuna

    path = config(tmp_path, tiny_model, "killed", "train.max_steps=5000", n_trials=2, heartbeat_interval=1)
    proc = mlops(env, "run", "--config", str(path), "--storage", postgres_url, start_new_session=True)
    storage = optuna.storages.RDBStorage(postgres_url)
    run_id = None
    deadline = time.monotonic() + 900
    while run_id is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1)
        if "killed" in [s.study_name for s in storage.get_all_studies()]:
            study = optuna.load_study(study_name="killed", storage=storage)
            running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
            run_id = running[0].user_attrs.get("mlflow_run_id") if running else None
    assert run_id, proc.log.read_text()[-4000:]
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)

    time.sleep(5)  # grace period: 3 x heartbeat_interval (1 s)
    info = status(env, "killed", postgres_url)
    states = {t["number"]: t["state"] for t in info["trials"]}
    assert states == {0: "FAIL", 1: "WAITING"}, states  # nothing is left RUNNING; trial 1 waits for a worker

    from mlflow import MlflowClient

    run = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"]).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags[Tag.SWEEP_TRIAL_STATE] == "FAIL"
    assert "stopped sending heartbeats" in run.data.tags[Tag.FAILURE_REASON]
