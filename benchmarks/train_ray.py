"""Section 6 of bench_train.py (`--parts ray`): training as a service on a real local Ray cluster (a head and a
worker node, separate `ray start` processes), against `mlops train run` on the same machine.

1. Step time under Ray Train (a submitted job, 2 workers) against `mlops train run --nproc 2` (torchrun), same
   config: the median `step_s` of each step trace past the first few steps (goal <= 1.05x).
2. Submit to first step: the wall time from `mlops train submit` starting to the job's first trace line, and how
   much of it the submit command itself took (admission: identity, policy, plan, quota).
3. Node loss to training again: the worker node's raylet is SIGKILLed mid-run; the time until the restarted
   worker group writes its next step (Ray's failure detection, the group's restart, the checkpoint load).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAST_HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
               "RAY_health_check_failure_threshold": "3"}
PASSWORD = "Trainer-Key-2026"


def _trace(path: Path) -> dict:
    from training.drill import read_trace

    return read_trace(path)


def median_step(path: Path, skip: int = 5) -> float:
    steps = _trace(path)
    return statistics.median(r["step_s"] for s, r in steps.items() if s > skip)


def _setup(tmp: Path) -> None:
    from registry.identities import set_policy
    from registry.testing import make_identities

    make_identities()
    from registry.testing import signed_in

    policy = tmp / "teams.yaml"
    policy.write_text("registry:\n  teams:\n    bench: {members: [tina], quota_device_hours: 1000, max_concurrent: 2}\n")
    set_policy(signed_in("admin"), policy)


def _mlops(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLOPS_USER": "tina", "MLOPS_PASSWORD": PASSWORD, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mlops", *args], env=env, capture_output=True, text=True,
                          check=True, cwd=REPO)


def _wait(predicate, timeout: float = 900.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError("benchmark step timed out")


def bench_ray(base: list[str], steps: int, tmp: Path) -> None:
    from mlops.tenancy import team_checkpoints_dir, team_snapshots_dir
    from tests.ray_cluster import RayCluster
    from training.testing import make_snapshot

    print("\n== Training as a service: Ray Train on a local 2-node cluster vs `mlops train run --nproc 2` ==")
    _setup(tmp)
    snap = make_snapshot(team_snapshots_dir("bench"), train=512, validation=16)
    common = [b for b in base if not b.startswith("train.snapshot=")] + [
        f"train.snapshot={snap}", f"train.max_steps={steps}", "train.checkpoint_every=10", "train.eval_every=1000",
        "train.final_model=false", "run.log_every=10"]
    local = tmp / "torchrun"
    env_snap = {**os.environ, "MLOPS_SNAPSHOTS_DIR": str(team_snapshots_dir("bench"))}
    subprocess.run([sys.executable, "-m", "mlops", "train", "run", "--nproc", "2", *common,
                    f"train.checkpoint.dir={local}"], env={**env_snap, "OMP_NUM_THREADS": "1"}, check=True,
                   capture_output=True, cwd=REPO)
    cluster = RayCluster(nodes=2, cpus_per_node=1, head_cpus=2, dashboard=True, env=FAST_HEALTH).start()
    try:
        submit = ["train", "submit", "--team", "bench", *common, f"train.cluster.address={cluster.dashboard}",
                  "train.cluster.workers=2", "train.cluster.poll_seconds=0.2"]
        started = time.perf_counter()
        _mlops(*submit)
        admitted = time.perf_counter() - started
        root = team_checkpoints_dir("bench")
        trace = _wait(lambda: next(iter(root.glob("*/trace.jsonl")), None))
        _wait(lambda: _trace(trace))
        first_step = time.perf_counter() - started
        _wait(lambda: len(_trace(trace)) >= steps, every=0.5)
        ray_step, run_step = median_step(trace), median_step(local / "trace.jsonl")
        print(f"step time (median, steps > 5): Ray Train {ray_step * 1000:.1f} ms vs torchrun "
              f"{run_step * 1000:.1f} ms -> {ray_step / run_step:.3f}x (goal <= 1.05)")
        print(f"submit to first step: {first_step:.1f} s (of which the submit command, admission included: "
              f"{admitted:.1f} s)")
        _node_loss(cluster, submit, root, steps)
    finally:
        cluster.stop()


def _node_loss(cluster, submit: list[str], root: Path, steps: int) -> None:
    """A second job (another seed, so a fresh folder): kill the worker node mid-run, time the way back."""
    _mlops(*submit, "run.seed=99", f"train.max_steps={steps * 3}")
    trace = _wait(lambda: next((p for p in root.glob("*/trace.jsonl") if len(_trace(p)) < steps), None))
    _wait(lambda: len(_trace(trace)) >= 15, every=0.02)
    inode = trace.stat().st_ino
    killed = time.perf_counter()
    cluster.kill_raylet(1)
    # The resumed group rewrites the trace (up to its checkpoint) and appends its next step to the new file.
    _wait(lambda: trace.exists() and trace.stat().st_ino != inode, every=0.05)
    resumed = _wait(lambda: trace.exists() and trace.stat().st_ino != inode and _new_step(trace), every=0.05)
    back = time.perf_counter() - killed
    print(f"node loss to training again: {back:.1f} s (resumed at step {resumed}; Ray's failure detection "
          "set to ~3 s here)")


def _new_step(trace: Path) -> int | None:
    """The first step the restarted group ran, once it is on the rewritten trace: a step past its checkpoint."""
    steps = _trace(trace)
    if not steps:
        return None
    last = max(steps)
    return last if last % 10 else None  # a checkpoint step (every 10) is where the rewritten trace starts
