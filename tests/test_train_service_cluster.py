"""Training as a service on a real Ray cluster on this machine: a head and a worker node, each its own `ray start`
process, jobs submitted through the real CLI by two teams' trainers.

One scenario, because each job costs a Ray Train start: team a's job trains; meanwhile team a queues a low-
priority job and team b a high-priority one, and b's starts first when a's ends (a's low job, still waiting, is
then cancelled by its submitter, after another team's user was refused); mid-way through b's job the
worker node's raylet is SIGKILLed: the worker group restarts on what is left and resumes from the last
checkpoint, and b's step trace equals a's uninterrupted one bit for bit (same config, another team's folder);
a submission over team a's quota is refused with nothing queued; `mlops usage` matches the runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.drill import compare, read_trace

REPO = Path(__file__).resolve().parent.parent
# About five minutes (two Ray Train jobs, a worker-group restart): CI and `make test-all` run it.
pytestmark = pytest.mark.slow
TRAINERS = {"tina": "Trainer-Key-2026", "tom": "Second-Trainer-2026"}
# Fast failure detection: the head declares a silent node dead after ~1.5 s instead of ~15 s.
FAST_HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
               "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "500"}
STEPS = 24


@pytest.fixture
def service(mlops_home, tiny_model, tmp_path):
    from mlops.tenancy import team_snapshots_dir
    from registry.identities import add_user, set_policy
    from registry.testing import make_identities
    from tests.ray_cluster import RayCluster
    from training.testing import make_snapshot

    ids = make_identities()
    add_user(ids["admin"], "tom", "trainer", TRAINERS["tom"])
    policy = tmp_path / "teams.yaml"
    policy.write_text("registry:\n  teams:\n"
                      "    team-a: {members: [tina], quota_device_hours: 0.5, max_concurrent: 1}\n"
                      "    team-b: {members: [tom], quota_device_hours: 0.5, default_priority: high}\n")
    set_policy(ids["admin"], policy)
    snapshot = make_snapshot(team_snapshots_dir("team-a"), train=256)
    # team b trains on the same records under its own prefix (its own copy of the data, same id)
    make_snapshot(team_snapshots_dir("team-b"), train=256)
    cluster = RayCluster(nodes=2, cpus_per_node=1, head_cpus=2, dashboard=True, env=FAST_HEALTH).start()
    try:
        yield {"cluster": cluster, "snapshot": snapshot, "tiny": tiny_model}
    finally:
        cluster.stop()


def mlops(*args, user: str, check: bool = True, shell: bool = False) -> subprocess.CompletedProcess:
    """The CLI as `user`: in a process of its own that exits right after (`shell`), else in this one (no import
    cost; the same `main()`)."""
    env = {"MLOPS_USER": user, "MLOPS_PASSWORD": TRAINERS[user], "OMP_NUM_THREADS": "1"}
    if shell:
        proc = subprocess.run([sys.executable, "-m", "mlops", *args], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=600, cwd=REPO)
    else:
        from registry.testing import run_cli

        code, out, err = run_cli(*args, env=env)
        proc = subprocess.CompletedProcess(args, code, out, err)
    if check and proc.returncode != 0:
        raise AssertionError(f"mlops {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


def submit(service, team: str, user: str, *extra: str, check: bool = True, shell: bool = False):
    return mlops("train", "submit", "--config", str(REPO / "configs/train/tiny.yaml"), "--team", team,
                 f"base_model={service['tiny']['path']}", f"train.snapshot={service['snapshot']}",
                 f"train.max_steps={STEPS}", "train.checkpoint_every=4", "train.eval_every=20",
                 "train.final_model=false", "train.progress=false", "run.log_every=10",
                 f"train.cluster.address={service['cluster'].dashboard}", "train.cluster.workers=2",
                 "train.cluster.poll_seconds=0.5", *extra, user=user, check=check, shell=shell)


def job_id(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.split()[1]


T0 = time.monotonic()


def wait_for(what, predicate, timeout: float = 300.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            print(f"{time.monotonic() - T0:7.1f} s: {what}", flush=True)  # the phases, timed (shown on failure)
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def jobs_by_id(address: str) -> dict:
    from training.ray_jobs import service_jobs

    return {j.job_id: j for j in service_jobs(address)}


def test_two_teams_queue_by_priority_survive_a_lost_node_and_are_metered(service):
    from mlops.lineage import Tag
    from mlops.run_store import find_runs
    from training.ray_jobs import train_runs

    cluster = service["cluster"]
    address = cluster.dashboard
    first = job_id(submit(service, "team-a", "tina", shell=True))  # the job outlives the process that submitted it
    wait_for("team a's first job to train", lambda: jobs_by_id(address)[first].state == "TRAINING")
    low = job_id(submit(service, "team-a", "tina", "--priority", "low", "run.seed=7"))
    high = job_id(submit(service, "team-b", "tom"))  # team b's default priority: high
    queue = json.loads(mlops("train", "queue", "--address", address, "--json", user="tina").stdout)
    waiting = {r["job_id"]: r for r in queue if r["state"] == "WAITING"}
    assert waiting[high]["position"] == 1 and waiting[low]["position"] == 2
    assert waiting[high]["eta_s"] is not None and waiting[high]["eta_s"] <= waiting[low]["eta_s"]

    # Over team a's quota: refused with nothing queued.
    before = set(jobs_by_id(address))
    refused = submit(service, "team-a", "tina", "train.max_steps=2000000", check=False)
    assert refused.returncode == 3 and "Nothing was queued" in refused.stdout + refused.stderr
    assert set(jobs_by_id(address)) == before

    # Team b's job starts before team a's low-priority one; kill the worker node's raylet mid-run.
    wait_for("team b's job to train", lambda: jobs_by_id(address)[high].state == "TRAINING", timeout=400)
    assert jobs_by_id(address)[low].state == "WAITING"  # priority decided the order
    # The low job is cancelled while it waits: by its submitter, never by another team's user; it costs nothing.
    refused = mlops("train", "cancel", low, "--address", address, user="tom", check=False)
    assert refused.returncode == 3 and "submitted by tina" in refused.stdout + refused.stderr
    mlops("train", "cancel", low, "--address", address, user="tina")
    team_b_trace = wait_for("team b's trace", lambda: _trace_path("team-b"), timeout=300)
    worker_node_has_a_worker(cluster)
    wait_for("a checkpoint and a few steps of team b", lambda: len(read_trace(team_b_trace)) >= 6, every=0.05)
    killed_at = max(read_trace(team_b_trace))
    cluster.kill_raylet(1)
    assert killed_at < STEPS, "team b's job finished before the node was lost; raise STEPS"

    for job in (first, high, low):
        wait_for(f"job {job} to end", lambda j=job: jobs_by_id(address)[j].state in ("SUCCEEDED", "FAILED",
                                                                                    "STOPPED"), timeout=600, every=1.0)
    ended = jobs_by_id(address)
    assert {j: ended[j].state for j in (first, high, low)} == {first: "SUCCEEDED", high: "SUCCEEDED", low: "STOPPED"}
    spans = train_runs(address)
    assert low not in spans  # it never trained
    assert spans[high]["attempts"] >= 2  # the worker group restarted after the node was lost

    step, detail = compare(read_trace(_trace_path("team-a")), read_trace(team_b_trace), STEPS)
    assert step is None, detail

    runs = {r.data.tags[Tag.JOB_ID]: r for r in find_runs({}, status=None, having=(Tag.JOB_ID,))}
    assert runs[high].data.tags[Tag.TEAM] == "team-b" and runs[high].data.tags[Tag.SUBMITTED_BY] == "tom"
    assert runs[high].data.metrics["job_restarts"] >= 1
    usage = json.loads(mlops("usage", "--json", "--address", address, user="tina").stdout)
    metered = {j["job_id"]: j["device_hours"] for j in usage["jobs"]}
    for job in (first, high):
        span = spans[job]
        assert metered[job] == pytest.approx((span["end"] - span["start"]) * 2 / 3600, rel=1e-6)
        assert runs[job].data.metrics["device_hours"] == pytest.approx(metered[job])
    assert low not in metered
    team_a = [t for t in usage["totals"] if t["team"] == "team-a"]
    assert sum(t["device_hours"] for t in team_a) == pytest.approx(metered[first])


def _trace_path(team: str) -> Path | None:
    from mlops.tenancy import team_checkpoints_dir

    found = list(team_checkpoints_dir(team).glob("*/trace.jsonl"))
    return found[0] if found else None


def worker_node_has_a_worker(cluster) -> None:
    """The kill must hit a node that runs a rank: Ray placed one worker on each node (SPREAD)."""
    procs = cluster.processes(cluster.groups[1])
    names = " ".join(" ".join(p.cmdline()) for p in procs if p.is_running())
    assert "RayTrainWorker" in names or "ray::RayTrainWorker" in names, "no training worker on the worker node"
