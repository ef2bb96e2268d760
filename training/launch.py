"""Running the stage from the command line: one process in-process, several through torchrun or the
deepspeed launcher.

With nproc > 1 the launcher process does every check first (prepare), opens or re-opens the MLflow run, and
writes a spec (resolved config, run id, checkpoint to resume). Each worker (`mlops train worker --spec`)
joins the process group and calls `train()`; rank 0 logs to the shared run. Several nodes: set
`train.deepspeed.launcher=deepspeed` and `train.deepspeed.hostfile=<file>` (lines `host slots=N`); every node
needs the same checkout, venv and a shared filesystem for checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mlops.errors import MLOpsError

RESULT_ENV = "MLOPS_TRAIN_RESULT"


def shutdown_world() -> None:
    """barrier + destroy_process_group: without them gloo occasionally aborts at interpreter exit."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_training(cfg, *, nproc: int = 1, smoke: bool = False):
    """The CLI's core: returns the TrainResult (as a dict for multi-process runs)."""
    if nproc < 1:
        raise MLOpsError(f"--nproc must be at least 1, got {nproc}. Fix: pass --nproc 1 or more.")
    if nproc == 1 and not cfg.train.deepspeed.hostfile:
        from training.prepare import prepare
        from training.trainer import train

        try:
            prep = prepare(cfg, 1, smoke=smoke)
            return train(cfg, prepared=prep).as_dict()
        finally:
            shutdown_world()
    return launch(cfg, nproc, smoke)


def launch(cfg, nproc: int, smoke: bool) -> dict:
    from mlops.tracking import MlflowTracker
    from training.engine import free_port
    from training.prepare import prepare
    from training.runs import RUN_ID_ENV, open_tracker

    prep = prepare(cfg, nproc, smoke=smoke)
    if prep.completed is not None:
        return {**prep.completed, "status": "FINISHED", "reason": "already trained (train.checkpoint.resume=auto)"}
    tracker: MlflowTracker = open_tracker(prep, 0)
    t = prep.train
    t.checkpoint.resume = str(prep.resume_from) if prep.resume_from else "never"
    t.checkpoint.dir = str(prep.ckpt_dir)
    work = Path(tempfile.mkdtemp(prefix="mlops-train-"))
    spec = {"config": prep.cfg.model_dump(mode="json"), "smoke": smoke}
    (work / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, RUN_ID_ENV: tracker.run_id, "MLFLOW_RUN_ID": tracker.run_id,
           RESULT_ENV: str(work / "result.json"), "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "")}
    if not env["DS_ACCELERATOR"]:
        env.pop("DS_ACCELERATOR")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    port = t.deepspeed.master_port or free_port()
    cmd = launcher_command(t.deepspeed.launcher, nproc, port, t.deepspeed.hostfile) + [
        "mlops", "train", "worker", "--spec", str(work / "spec.json")]
    proc = subprocess.run(cmd, env=env)
    result_path = work / "result.json"
    try:
        if proc.returncode != 0 or not result_path.exists():
            _fail_if_running(tracker, f"training workers exited with status {proc.returncode}")
            raise MLOpsError(
                f"multi-process training failed (launcher exit status {proc.returncode}); see the worker output "
                f"above. Run {tracker.run_id} is marked FAILED unless a worker recorded a reason. Fix: correct the "
                "cause and rerun the same command: it resumes from the last complete checkpoint."
            )
        return json.loads(result_path.read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def launcher_command(kind: str, nproc: int, port: int, hostfile: str | None) -> list[str]:
    """The launcher's argv up to the module to run (each launcher spells "run a module" its own way)."""
    if kind == "deepspeed" or hostfile:
        exe = shutil.which("deepspeed") or str(Path(sys.executable).with_name("deepspeed"))
        cmd = [exe, "--master_port", str(port), "--no_local_rank"]  # LOCAL_RANK comes by env
        if hostfile:
            cmd += ["--hostfile", hostfile]
        else:
            cmd += ["--num_gpus", str(nproc)]
        return cmd + ["--module"]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
            str(port), "--master_addr", "127.0.0.1", "-m"]


def _fail_if_running(tracker, reason: str) -> None:
    run = tracker.client.get_run(tracker.run_id)
    if run.info.status == "RUNNING":
        tracker.close("FAILED", reason=reason)


def worker(spec_path: Path) -> None:
    """One rank of a multi-process run (started by the launcher, never by hand)."""
    from mlops.config import validate_config
    from training.engine import init_world
    from training.prepare import prepare
    from training.trainer import train

    spec = json.loads(Path(spec_path).read_text())
    cfg = validate_config(spec["config"], source=str(spec_path))
    try:
        world = init_world(cfg.train.deepspeed.backend)
        prep = prepare(cfg, world.size, smoke=spec["smoke"], verify_inputs=False)
        result = train(cfg, prepared=prep)
        if world.rank == 0 and os.environ.get(RESULT_ENV):
            Path(os.environ[RESULT_ENV]).write_text(json.dumps(result.as_dict()))
    finally:
        shutdown_world()
