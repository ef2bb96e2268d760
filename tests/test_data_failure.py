"""A build that is killed or terminated cleans up after itself, or is cleaned up by the next build: no worker
process, no staging folder and no RUNNING run is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
POOL_SCRIPT = textwrap.dedent("""
    import sys, time
    from mlops.data.build import sigterm_raises
    from mlops.data.parallel import OrderedPool

    def init():
        pass

    def slow(x):
        time.sleep(120)
        return x

    with sigterm_raises(), OrderedPool(2, init) as pool:
        for _ in pool.map(slow, range(8)):
            pass
""")


def wait_for(predicate, timeout: float = 60.0, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout} s")


def gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def start_pool() -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    workers = wait_for(lambda: [c.pid for c in psutil.Process(proc.pid).children()] if len(
        psutil.Process(proc.pid).children()) >= 2 else None)
    time.sleep(0.3)  # the workers' own set-up (parent watch, signal handlers) runs first
    return proc, workers


def test_pool_workers_die_with_a_sigkilled_parent():
    proc, workers = start_pool()
    proc.kill()
    proc.wait(10)
    assert gone(workers), "pool workers outlived their SIGKILLed parent"


def test_sigterm_stops_the_pool_workers_and_exits():
    proc, workers = start_pool()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) != 0
    assert gone(workers, timeout=2), "SIGTERM left pool workers running"


# --------------------------------------------------------------------------- the real CLI


def write_config(home: Path, tiny_model: dict, records: int) -> Path:
    from mlops.data.labelled_dedup import conversations
    from mlops.data.testing import write_jsonl

    write_jsonl(home / "data" / "chats.jsonl", conversations(records, seed=21))
    config = home / "data.yaml"
    config.write_text(json.dumps({
        "base_model": tiny_model["path"], "run": {"experiment": "data", "seed": 1},
        "data": {"sources": [{"path": "data/chats.jsonl"}], "workers": 2, "batch_size": 64, "seq_len": 256,
                 "filters": {"steps": ["length", "short_answer"]}},
    }))
    return config


def runs(home: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{home / '.mlops' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("data")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def staging(home: Path) -> list[Path]:
    root = home / ".mlops" / "snapshots"
    return [p for p in root.glob(".staging-*")] if root.is_dir() else []


def start_build(home: Path, config: Path) -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "MLOPS_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-m", "mlops", "data", "build", "--config", str(config)], cwd=home,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = wait_for(lambda: [c.pid for c in psutil.Process(proc.pid).children()] if len(
        psutil.Process(proc.pid).children()) >= 2 else None, timeout=180)
    return proc, workers


@pytest.mark.slow
def test_killed_builds_leave_nothing_behind_once_the_next_build_starts(mlops_home, tiny_model):
    config = write_config(mlops_home, tiny_model, records=2000)

    proc, workers = start_build(mlops_home, config)  # SIGTERM: the build cleans up itself
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err
    assert gone(workers) and staging(mlops_home) == []
    (run,) = runs(mlops_home)
    assert run.info.status == "KILLED"

    proc, workers = start_build(mlops_home, config)  # SIGKILL: nothing runs any more cleanup in the build
    proc.kill()
    proc.wait(30)
    assert gone(workers), "workers outlived the SIGKILLed build"
    assert len(staging(mlops_home)) == 1 and sorted(r.info.status for r in runs(mlops_home)) == ["KILLED", "RUNNING"]

    env = {**os.environ, "MLOPS_HOME": str(mlops_home), "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-m", "mlops", "data", "build", "--config", str(config)], cwd=mlops_home,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert staging(mlops_home) == []
    statuses = sorted(r.info.status for r in runs(mlops_home))
    assert statuses == ["FINISHED", "KILLED", "KILLED"]
    reaped = [r for r in runs(mlops_home) if "is gone" in r.data.tags.get("mlops.failure_reason", "")]
    assert len(reaped) == 1
