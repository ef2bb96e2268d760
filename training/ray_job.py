"""The driver of one admitted training job (`mlops train job`, the Ray job's entrypoint, never run by hand).

1. Wait for the turn (training.queue_rules over the cluster's job table), then hold a marker actor for as long as
   the driver lives, so the queue counts this job as training.
2. Do what `mlops train run`'s launcher does (prepare: every check, the checkpoint folder's lock, the MLflow run),
   with the job's lineage tags (team, job, cluster, submitter, priority).
3. Train with Ray Train: a `TorchTrainer` whose workers each run one rank of the usual trainer (Ray sets up
   torch.distributed: gloo on CPU, NCCL on GPU). A lost worker or node restarts the worker group
   (`FailureConfig(max_failures)`), and every rank resumes from the newest verified full-state checkpoint, so
   the step trace is the uninterrupted one.
4. Meter: Ray Train's own span of the run x devices, on the MLflow run; then the usual training attestation
   (signed only where the cluster runs with an identity: a submitter's password never travels with a job).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)


class TrainingMarker:
    """Held by a job's driver from its turn until it ends: the queue's sign that the job is training."""

    def ready(self) -> bool:
        return True


def run_job() -> int:
    """The entrypoint: train the job in MLOPS_JOB_SPEC; its exit status."""
    import ray

    from mlops.config import validate_config
    from training.submit import SPEC_ENV

    spec = json.loads(os.environ[SPEC_ENV])
    _cancel_on_sigterm()
    _say(f"job {spec['job_id']} of team {spec['team']} ({spec['priority']}), submitted by {spec['user']}")
    ray.init(log_to_driver=True)
    marker = wait_for_turn(spec)  # noqa: F841 - held: the actor lives as long as this reference
    cfg = validate_config(spec["config"], source=f"job {spec['job_id']}")
    result = train_job(cfg, spec)
    print(json.dumps({k: v for k, v in result.items() if k != "metrics"}), flush=True)
    return 0 if result.get("status") in ("FINISHED", "STOPPED") else 1


def _say(message: str) -> None:
    """A line of the job's log (`ray job logs JOB`), stamped: the queue's and the job's phases, timed."""
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def _cancel_on_sigterm() -> None:
    """`mlops train cancel` (Ray's stop_job) sends SIGTERM, then SIGKILL a few seconds later: leave through the
    usual error path, so the run is closed KILLED and the time trained so far is metered."""
    import signal

    def cancelled(signum, frame):
        raise KeyboardInterrupt(f"cancelled ({signal.Signals(signum).name} from `mlops train cancel`)")

    signal.signal(signal.SIGTERM, cancelled)


def wait_for_turn(spec: dict):
    """Block until the queue rule gives this job its turn; returns the marker actor it then holds."""
    import ray

    from training.queue_rules import TRAINING, may_start
    from training.ray_jobs import MARKER_NAMESPACE, MARKER_PREFIX, devices, service_jobs, team_limits

    address, job_id = spec["address"], spec["job_id"]
    c = spec["config"]["train"]["cluster"]
    said = None
    while True:
        try:
            jobs = service_jobs(address)
            capacity = devices(address, c["use_gpu"], c["cpus_per_worker"])
        except Exception as err:  # noqa: BLE001 - a dashboard restarting for a moment must not end a queued job
            ok, reason = False, f"the cluster's job table did not answer ({type(err).__name__}); asking again"
        else:
            free = capacity - sum(j.devices for j in jobs if j.state == TRAINING)
            ok, reason = may_start(job_id, jobs, team_limits(jobs), free)
        if ok:
            break
        if reason != said:
            _say(f"waiting: {reason}")
            said = reason
        time.sleep(float(c["poll_seconds"]))
    marker = ray.remote(num_cpus=0)(TrainingMarker).options(name=MARKER_PREFIX + job_id,
                                                             namespace=MARKER_NAMESPACE).remote()
    ray.get(marker.ready.remote())
    _say(f"starting: {reason}")
    return marker


def train_job(cfg, spec: dict) -> dict:
    from training.launch import RESULT_ENV, WorkerError
    from training.prepare import prepare
    from training.runs import RUN_ID_ENV, open_tracker

    prep = prepare(cfg, spec["devices"])  # every check, and the folder's lock, held until the job ends
    try:
        if prep.completed is not None:
            return {**prep.completed, "status": "FINISHED", "reason": "already trained"}
        tracker = open_tracker(prep, 0)
        if prep.lock is not None:
            prep.lock.update(run_id=tracker.run_id)
        tracker.set_tags(job_tags(spec))
        work = prep.ckpt_dir / "jobs" / spec["job_id"]
        work.mkdir(parents=True, exist_ok=True)
        loop = {"config": _worker_config(prep), "ckpt_dir": str(prep.ckpt_dir), "result": str(work / "result.json"),
                "attempts": str(work / "attempts"), "env": {RUN_ID_ENV: tracker.run_id, "MLFLOW_RUN_ID": tracker.run_id,
                                                            RESULT_ENV: str(work / "result.json")}}
        started = time.time()
        _say(f"run {tracker.run_id} prepared; starting {spec['devices']} Ray Train workers")
        try:
            _fit(prep, spec, loop)
        except BaseException as err:
            meter(tracker, spec, started, loop["attempts"])
            _fail(tracker, err)
            raise
        metered = meter(tracker, spec, started, loop["attempts"])
        _say(f"trained; metered {metered['device_hours']:.4f} device-hours ({metered['job_restarts']} restarts)")
        result_path = Path(loop["result"])
        if not result_path.exists():
            raise WorkerError(f"job {spec['job_id']}: Ray Train finished without a result from rank 0. Fix: see the "
                              f"job's logs (`ray job logs {spec['job_id']}`).")
        result = json.loads(result_path.read_text())
        if result.get("error"):
            raise WorkerError(result["error"], int(result.get("exit_code", 2)))
    finally:
        prep.release()
    from training.attest import attest_training

    attest_training(result)
    return result


def job_tags(spec: dict) -> dict:
    from mlops.lineage import Tag

    return {Tag.TEAM: spec["team"], Tag.JOB_ID: spec["job_id"], Tag.CLUSTER: spec["address"],
            Tag.SUBMITTED_BY: spec["user"], Tag.PRIORITY: spec["priority"]}


def _worker_config(prep) -> dict:
    """The config every worker (and every restart of it) trains with: resume from the newest verified checkpoint
    of the job's folder."""
    t = prep.train
    t.checkpoint.resume = "auto"
    t.checkpoint.dir = str(prep.ckpt_dir)
    return prep.cfg.model_dump(mode="json")


def _fit(prep, spec: dict, loop: dict) -> None:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    c = prep.train.cluster
    resources = {"CPU": c.cpus_per_worker, **({"GPU": 1} if c.use_gpu else {})}
    backend = prep.train.deepspeed.backend
    trainer = TorchTrainer(
        worker_loop, train_loop_config=loop,
        torch_config=TorchConfig(backend=None if backend == "auto" else backend),
        scaling_config=ScalingConfig(num_workers=c.workers, use_gpu=c.use_gpu, resources_per_worker=resources,
                                     placement_strategy=c.placement),
        run_config=RunConfig(name=spec["job_id"], storage_path=spec["storage_path"],
                             failure_config=FailureConfig(max_failures=c.max_failures)))
    trainer.fit()


def worker_loop(loop: dict) -> None:
    """One rank, in a Ray Train worker: the usual worker body (training.launch), resuming from the newest
    verified checkpoint, so a restarted group continues exactly where the last checkpoint left off."""
    import ray.train

    from mlops.config import validate_config
    from training.launch import _work
    from training.stopping import Preempted

    os.environ.update(loop["env"])
    if ray.train.get_context().get_world_rank() == 0:
        with open(loop["attempts"], "a") as fh:
            fh.write(f"{time.time()}\n")
    cfg = validate_config(loop["config"], source="ray train worker")
    _work(cfg, {"smoke": False}, Path(loop["ckpt_dir"]), Preempted)


def meter(tracker, spec: dict, started: float, attempts_file: str) -> dict:
    """Charge the job: Ray Train's span of the run (falling back to the driver's own clock) x devices."""
    from training.queue_rules import month_of
    from training.usage import MONTH_TAG

    span = _span(spec)
    start, end, source = (span["start"], span["end"], "ray-train") if span else (started, time.time(), "driver")
    try:
        restarts = max(0, len(Path(attempts_file).read_text().splitlines()) - 1)
    except OSError:
        restarts = 0
    wall = max(0.0, end - start)
    metrics = {"device_hours": wall * spec["devices"] / 3600, "job_wall_s": wall, "job_devices": spec["devices"],
               "job_restarts": restarts, "job_planned_hours": spec["planned_hours"]}
    try:
        tracker.set_tags({MONTH_TAG: month_of(start), "mlops.metering_source": source})
        tracker.log_metrics(metrics)
        tracker.flush()
    except Exception as err:  # noqa: BLE001 - the usage report falls back to the cluster's own record
        log.warning("could not write the metering of job %s: %s", spec["job_id"], err)
    return metrics


def _span(spec: dict, wait_s: float = 10.0) -> dict | None:
    """Ray Train's record of the run once it has an end (it is written a moment after fit returns)."""
    from training.ray_jobs import train_runs

    deadline = time.monotonic() + wait_s
    while True:
        span = train_runs(spec["address"]).get(spec["job_id"])
        if span is None or span["end"] is not None or time.monotonic() > deadline:
            return span if span and span["end"] else None
        time.sleep(0.5)


def _fail(tracker, err: BaseException) -> None:
    from mlops.errors import MLOpsError

    reason = str(err) if isinstance(err, MLOpsError) else f"{type(err).__name__}: {err}"
    try:
        if tracker.status() == "RUNNING":
            tracker.close("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED", reason=reason[:4000])
    except Exception as close_err:  # noqa: BLE001 - the job still reports its own error
        print(f"could not close run {tracker.run_id}: {close_err}", file=sys.stderr)
