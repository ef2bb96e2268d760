"""The training service's view of a Ray cluster, through Ray's own APIs only: the Jobs API (its job table is the
queue: every submission is a Ray job carrying its team, user, priority and plan as metadata), the state API
(nodes and their devices, and the marker actor a job holds while it trains) and, on the embedded default, a
local head started with `ray start` so that jobs outlive the shell that submitted them.

The address is the head's dashboard (`http://HEAD:8265`): `train.cluster.address`, else `RAY_ADDRESS`, else the
local head under this store (started on first use).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mlops.errors import MLOpsError
from training.queue_rules import ENDED, TRAINING, WAITING, Job

KIND = "mlops-train"  # metadata["kind"] of the service's jobs; others on the cluster are not ours
MARKER_NAMESPACE = "mlops-train"  # the namespace of the actor a job holds while it trains
MARKER_PREFIX = "training-"


class ClusterUnreachable(MLOpsError):
    """Nothing answers at the cluster's address (or Ray's job server is not running there)."""


def cluster_address(configured: str | None) -> str:
    """The dashboard address to use: the config's, RAY_ADDRESS, else the local head (started if needed)."""
    address = (configured or os.environ.get("RAY_ADDRESS", "")).strip()
    if not address:
        return local_head()
    if address.startswith("ray://") or "://" not in address and address.count(":") == 1 and \
            address.rsplit(":", 1)[1] == "6379":
        raise MLOpsError(f"train.cluster.address={address} is a GCS or Ray Client address; jobs are submitted to "
                         "the head's dashboard. Fix: pass http://HEAD:8265 (the --dashboard-port of `ray start "
                         "--head`), or set RAY_ADDRESS to it.")
    return address if "://" in address else f"http://{address}"


def client(address: str):
    """A Jobs API client, or ClusterUnreachable naming the fix."""
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError or ValueError here
        raise ClusterUnreachable(
            f"the Ray cluster at {address} cannot be reached ({type(err).__name__}: {str(err)[:200]}). Nothing was "
            "queued. Fix: start the head there (`ray start --head --dashboard-host=0.0.0.0` from this checkout's "
            "virtualenv), correct train.cluster.address / RAY_ADDRESS, or unset both to use a local Ray."
        ) from None


def devices(address: str, use_gpu: bool, cpus_per_worker: float) -> int:
    """How many workers of this shape the cluster's live nodes hold in all."""
    from ray.util.state import list_nodes

    try:
        nodes = list_nodes(address=address, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
    except Exception as err:  # noqa: BLE001 - the state API raises several kinds for a dead head
        raise ClusterUnreachable(f"the Ray cluster at {address} did not list its nodes ({err}). Nothing was "
                                 "queued. Fix: check the head is up (`ray status`).") from None
    total = 0
    for node in nodes:
        res = node.resources_total or {}
        total += int(res.get("GPU", 0)) if use_gpu else int(res.get("CPU", 0) // cpus_per_worker)
    return total


def training_markers(address: str) -> set[str]:
    """Ids of the jobs whose turn came: each holds a live marker actor from its turn until its driver ends, so
    the gap between the turn and Ray Train's first worker is never open to a second job."""
    from ray.util.state import list_actors

    actors = list_actors(address=address, filters=[("class_name", "=", "TrainingMarker"), ("state", "=", "ALIVE")],
                         limit=10_000, raise_on_missing_output=False)
    return {a.name.removeprefix(MARKER_PREFIX) for a in actors if (a.name or "").startswith(MARKER_PREFIX)}


def train_runs(address: str) -> dict[str, dict]:
    """Ray Train's own record of each training run, by run name (the job id): {"start", "end" (None while it
    runs), "attempts"}, in epoch seconds. Metering charges this span: it includes every restart after a lost
    worker, and none of the time a job waited for its turn. Empty where the cluster keeps no Train state."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{address}/api/train/v2/runs/v1", timeout=10) as resp:
            runs = json.loads(resp.read()).get("train_runs", [])
    except (OSError, ValueError):
        return {}
    out = {}
    for run in runs:
        start, end = run.get("start_time_ns"), run.get("end_time_ns")
        if start:
            out[run.get("name", "")] = {"start": start / 1e9, "end": end / 1e9 if end else None,
                                        "attempts": len(run.get("attempts") or [])}
    return out


def service_jobs(address: str, jobs_client=None) -> list[Job]:
    """Every job of the training service in the cluster's job table, with its queue state and training span."""
    jobs_client = jobs_client or client(address)
    marked, spans = training_markers(address), train_runs(address)
    out = []
    for info in jobs_client.list_jobs():
        meta = info.metadata or {}
        if meta.get("kind") != KIND or not info.submission_id:
            continue
        out.append(job_of(info, meta, info.submission_id in marked, spans.get(info.submission_id)))
    return out


def job_of(info, meta: dict, marked: bool, span: dict | None) -> Job:
    status = str(getattr(info.status, "value", info.status))
    if status in ("PENDING", "RUNNING"):
        state = TRAINING if marked else WAITING
    else:
        state = status if status in ENDED else "FAILED"
    return Job(info.submission_id, meta.get("team", "?"), meta.get("user", "?"), meta.get("priority", "normal"),
               state, float(meta.get("submitted", 0)), int(meta.get("devices", 1)),
               float(meta.get("planned_hours", 0)), meta.get("model", ""),
               span["start"] if span else None, span["end"] if span else None,
               extra={"max_concurrent": int(meta.get("max_concurrent", 1)), "message": info.message or "",
                      "ray_status": status})


def team_limits(jobs: list[Job]) -> dict[str, int]:
    """Each team's concurrency limit, as its newest submission recorded it from the policy in force."""
    limits: dict[str, int] = {}
    for job in sorted(jobs, key=lambda j: j.submitted):
        limits[job.team] = int(job.extra.get("max_concurrent", 1))
    return limits


# --------------------------------------------------------------------------- the local head


def _head_state() -> Path:
    from mlops.paths import mlops_dir

    return mlops_dir() / "ray" / "head.json"


def _answers(address: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{address}/api/version", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def local_head_address() -> str | None:
    """The local head's dashboard if one is running (never starts one)."""
    state = _head_state()
    if state.is_file():
        address = json.loads(state.read_text()).get("dashboard", "")
        if address and _answers(address):
            return address
    return None


def local_head() -> str:
    """The dashboard address of this store's local Ray head, started (detached, as `ray start --head`) when
    none answers: jobs then outlive the shell. `ray stop` ends it."""
    running = local_head_address()
    if running:
        return running
    import hashlib

    from mlops.files import free_port

    state = _head_state()
    key = hashlib.sha256(str(state).encode()).hexdigest()[:8]
    temp = Path(f"/tmp/mlops-ray-{key}")  # short: Ray's socket paths under it must stay below ~107 characters
    port, dash = free_port(), free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    cmd = [ray, "start", "--head", f"--port={port}", f"--dashboard-port={dash}", "--include-dashboard=true",
           f"--num-cpus={os.cpu_count() or 1}", f"--temp-dir={temp}", "--disable-usage-stats"]
    # The head (and every job on it) must not inherit the first submitter's identity.
    env = {k: v for k, v in os.environ.items() if k not in ("MLOPS_USER", "MLOPS_PASSWORD")}
    proc = subprocess.run(cmd, capture_output=True, text=True, start_new_session=True, timeout=180,
                          env={**env, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
    if proc.returncode != 0:
        raise ClusterUnreachable(f"could not start a local Ray head (`{' '.join(cmd)}` exited {proc.returncode}): "
                                 f"{proc.stdout[-800:]}{proc.stderr[-800:]}. Fix: set train.cluster.address to a "
                                 "running cluster's dashboard, or start one with `ray start --head`.")
    address = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + 60
    while not _answers(address):
        if time.monotonic() > deadline:
            raise ClusterUnreachable(f"the local Ray head started, but its job server at {address} did not answer "
                                     f"within 60 s. Fix: see its logs under {temp}/session_latest/logs.")
        time.sleep(0.5)
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"dashboard": address, "gcs": f"127.0.0.1:{port}", "temp_dir": str(temp)}))
    return address
