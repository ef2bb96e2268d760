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
    from training.attest import attest_training
    from training.stopping import graceful_signals

    if nproc < 1:
        raise MLOpsError(f"--nproc must be at least 1, got {nproc}. Fix: pass --nproc 1 or more.")
    if nproc == 1 and not cfg.train.deepspeed.hostfile:
        from training.prepare import prepare
        from training.trainer import train

        with graceful_signals(grace=cfg.train.checkpoint.grace_seconds if cfg.train else None):
            try:
                prep = prepare(cfg, 1, smoke=smoke)
                result = train(cfg, prepared=prep).as_dict()
            finally:
                shutdown_world()
    else:
        result = launch(cfg, nproc, smoke)
    attest_training(result)  # the trainer signs what the run produced (registration needs it)
    return result


class WorkerError(MLOpsError):
    """An error every rank agreed on (a guard, a full disk), reported by rank 0 through the result file."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def launch(cfg, nproc: int, smoke: bool) -> dict:
    """Check, lock the checkpoint folder and open the run here; then start the workers and stay their parent:
    stop notices are forwarded to them, and if this process dies they die with it."""
    from training.prepare import prepare
    from training.runs import open_tracker

    prep = prepare(cfg, nproc, smoke=smoke)  # holds the folder's lock until the workers are gone
    try:
        if prep.completed is not None:
            return {**prep.completed, "status": "FINISHED", "reason": "already trained (train.checkpoint.resume=auto)"}
        with Forwarder(prep.ckpt_dir, prep.train.checkpoint.grace_seconds) as forwarder:
            tracker = open_tracker(prep, 0)
            if prep.lock is not None:
                prep.lock.update(run_id=tracker.run_id)
            return _run_workers(prep, tracker, nproc, smoke, forwarder)
    finally:
        prep.release()


def _run_workers(prep, tracker, nproc: int, smoke: bool, forwarder: Forwarder) -> dict:
    from mlops.files import free_port
    from training.runs import RUN_ID_ENV, close_if_running
    from training.stopping import Preempted, child_dies_with_parent, launcher_env

    t = prep.train
    t.checkpoint.resume = str(prep.resume_from) if prep.resume_from else "never"
    t.checkpoint.dir = str(prep.ckpt_dir)
    work = Path(tempfile.mkdtemp(prefix="mlops-train-"))
    spec = {"config": prep.cfg.model_dump(mode="json"), "smoke": smoke, "ckpt_dir": str(prep.ckpt_dir)}
    (work / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, RUN_ID_ENV: tracker.run_id, "MLFLOW_RUN_ID": tracker.run_id,
           RESULT_ENV: str(work / "result.json"), "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", ""),
           **launcher_env(),
           # torchrun waits this long for workers it was asked to stop before it SIGKILLs them
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(int(t.checkpoint.grace_seconds + 60))}
    if not env["DS_ACCELERATOR"]:
        env.pop("DS_ACCELERATOR")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    port = t.deepspeed.master_port or free_port()
    cmd = launcher_command(t.deepspeed.launcher, nproc, port, t.deepspeed.hostfile) + [
        "mlops", "train", "worker", "--spec", str(work / "spec.json")]
    result_path = work / "result.json"
    try:
        if forwarder.signum is None:
            forwarder.proc = subprocess.Popen(cmd, env=env, preexec_fn=child_dies_with_parent)
            forwarder.wait(result_path)
        code = forwarder.proc.returncode if forwarder.proc else None
        if result_path.exists():
            return _result(json.loads(result_path.read_text()))
        if forwarder.signum is not None:
            reason = (f"stopped by {forwarder.name} before the workers wrote a checkpoint or a result "
                      f"(launcher exit status {code})")
            close_if_running(tracker.run_id, "KILLED", reason)
            raise Preempted(f"training {reason}. Run {tracker.run_id} is KILLED. To continue: rerun the same "
                            "command; it resumes from the last complete checkpoint.", forwarder.signum)
        _fail_if_running(tracker, f"training workers exited with status {code}")
        raise MLOpsError(
            f"multi-process training failed (launcher exit status {code}); see the worker output above. Run "
            f"{tracker.run_id} is marked FAILED unless a worker recorded a reason. Fix: correct the cause and rerun "
            "the same command: it resumes from the last complete checkpoint."
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _result(result: dict) -> dict:
    from training.stopping import Preempted

    if not result.get("error"):
        return result
    code = int(result.get("exit_code", 2))
    if result.get("status") == "KILLED":
        raise Preempted(result["error"], code - 128 if code > 128 else 15)
    raise WorkerError(result["error"], code)


class Forwarder:
    """The launcher's signal handling. SIGTERM/SIGINT go to every registered worker of this host (and to the
    launcher child when none registered yet, or when ranks run on other nodes); a second SIGINT, or workers
    still running `grace + 30` s after the notice, get SIGKILL."""

    def __init__(self, ckpt_dir: Path, grace: float) -> None:
        self.ckpt_dir, self.grace = ckpt_dir, grace
        self.proc: subprocess.Popen | None = None
        self.signum: int | None = None
        self.at = 0.0
        self._previous: dict = {}

    @property
    def name(self) -> str:
        import signal

        return signal.Signals(self.signum).name if self.signum else "none"

    def __enter__(self) -> Forwarder:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for sig, old in self._previous.items():
            signal.signal(sig, old)
        if self.proc is not None and self.proc.poll() is None:
            self.kill_all()  # leaving with live workers (an error here): never leave them training alone

    def _handle(self, signum, frame) -> None:
        import signal
        import time

        if self.signum is not None and signum == signal.SIGINT:
            print("second Ctrl-C: stopping every worker now, without a checkpoint", file=sys.stderr, flush=True)
            self.kill_all()
            return
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
            print(f"received {signal.Signals(signum).name}: every worker finishes its step and saves a checkpoint "
                  f"within {self.grace:g} s", file=sys.stderr, flush=True)
        self.forward(signum)

    def forward(self, signum: int) -> None:
        from training.lock import live_workers

        workers = live_workers(self.ckpt_dir)
        for w in workers:
            _signal(int(w["pid"]), signum)
        remote = self.proc is not None and len(workers) == 0 or self._multi_node()
        if remote and self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def _multi_node(self) -> bool:
        return self.proc is not None and "--hostfile" in (self.proc.args or [])

    def kill_all(self) -> None:
        import signal

        from training.lock import live_workers

        for w in live_workers(self.ckpt_dir):
            _signal(int(w["pid"]), signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def wait(self, result_path: Path) -> None:
        import time

        forwarded = 0
        while True:
            try:
                self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if self.signum is not None:
                late = time.monotonic() - self.at
                if forwarded < 3 and late > forwarded + 1:  # workers that registered after the notice
                    forwarded += 1
                    self.forward(self.signum)
                if late > self.grace + 30:
                    print(f"workers still running {late:.0f} s after {self.name}: killing them", file=sys.stderr)
                    self.kill_all()
            if self.proc.poll() is not None:
                break
        # Ranks on other nodes may still be saving after the local launcher returned: give them the grace.
        while self.signum is not None and not result_path.exists() and time.monotonic() - self.at < self.grace:
            time.sleep(0.5)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


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
    """One rank of a multi-process run (started by the launcher, never by hand). Dies with its launcher; a stop
    notice ends it after the current step with a checkpoint. Errors every rank agreed on (guards, preemption,
    a full disk) are written to the result file by rank 0 and the ranks exit 0 together, so the launcher
    child never tears down a rank that is still saving."""
    from mlops.config import validate_config
    from training.lock import register_worker
    from training.stopping import Preempted, Watchdog, graceful_signals

    watchdog = Watchdog().start()
    spec = json.loads(Path(spec_path).read_text())
    ckpt_dir = Path(spec["ckpt_dir"])
    register_worker(ckpt_dir, int(os.environ.get("RANK", "0")))
    cfg = validate_config(spec["config"], source=str(spec_path))
    try:
        with graceful_signals(escalate=False, grace=cfg.train.checkpoint.grace_seconds):
            _work(cfg, spec, ckpt_dir, Preempted)
    finally:
        watchdog.stop()


def _work(cfg, spec: dict, ckpt_dir: Path, preempted: type) -> None:
    from training.engine import init_world
    from training.prepare import prepare
    from training.trainer import train

    world = init_world(cfg.train.deepspeed.backend)
    try:
        from training.consistency import check_ranks

        check_ranks(world)  # every rank agrees or every rank refuses, before anything else
        prep = prepare(cfg, world.size, smoke=spec["smoke"], verify_inputs=False, lock=False, ckpt_dir=ckpt_dir)
        result = train(cfg, prepared=prep).as_dict()
    except preempted as err:  # every rank agreed on the stop: they all reach the barrier below
        result = {"status": "KILLED", "error": str(err), "exit_code": err.exit_code}
    except BaseException as err:
        return _exit_alone(world, err)
    if world.rank == 0 and os.environ.get(RESULT_ENV):
        Path(os.environ[RESULT_ENV]).write_text(json.dumps(result))
    shutdown_world()


def _exit_alone(world, err: BaseException) -> None:
    """A rank that fails on its own leaves at once, saying why. The others may be inside a collective it will
    never join: a barrier would hang them all until gloo's 10-minute timeout, whereas a non-zero exit makes the
    launcher stop every worker now. Rank 0 first writes the error where the launcher reads the result."""
    import traceback

    code = getattr(err, "exit_code", 1) or 1
    if not isinstance(err, MLOpsError):
        if world.size == 1:
            raise err
        print(f"[rank{world.rank}] {traceback.format_exc()}", file=sys.stderr, flush=True)
    elif world.rank == 0 and os.environ.get(RESULT_ENV):  # the launcher reports it
        Path(os.environ[RESULT_ENV]).write_text(json.dumps({"status": "FAILED", "error": str(err), "exit_code": code}))
    else:
        print(f"[rank{world.rank}] error: {err}", file=sys.stderr, flush=True)
    if world.size == 1:
        return shutdown_world()
    sys.stdout.flush()
    os._exit(code)
