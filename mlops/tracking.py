"""Tracking behind one small interface. This is the only module that calls MLflow's logging API, and the one
MLflow store-access module: the client, and what the store's errors mean (missing vs. an outage).

Embedded default: SQLite at `<home>/.mlops/mlflow.db` with artifacts under `<home>/.mlops/artifacts`.
`MLFLOW_TRACKING_URI` wins when set (a tracking server over PostgreSQL is the scale path). Under
`mlflow run`, MLflow has already created a run and exported `MLFLOW_RUN_ID`: the tracker attaches to it.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from mlops.errors import MLOpsError, NotFoundError, TrackingError
from mlops.lineage import Tag
from mlops.paths import mlops_dir
from mlops.reaper import Reaped, death_reason

RUN_ID_ENV = "MLFLOW_RUN_ID"
URI_ENV = "MLFLOW_TRACKING_URI"


class RegistryUnavailableError(TrackingError):
    """The tracking store or registry could not be read (network, auth, database): not the same as 'not found'."""


# --------------------------------------------------------------------------- store access (the one module: client and errors)


def client(uri: str | None = None):
    """An MLflow client of `uri` (default: the tracking URI in force now)."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri or tracking_uri())


def is_missing(err: BaseException) -> bool:
    """True only for MLflow's 'this does not exist' answers; outages, auth and database errors are not."""
    from mlflow.exceptions import MlflowException

    if not isinstance(err, MlflowException):
        return False
    code = getattr(err, "error_code", "")
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in str(err))


def unavailable(err: BaseException, what: str) -> RegistryUnavailableError:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    return RegistryUnavailableError(
        f"could not read {what} from the tracking store {tracking_uri()} ({type(err).__name__}: {first}). "
        f"This is an outage or access problem, not a missing model. Fix: check that the tracking server or "
        f"database is up and reachable and that {URI_ENV} names it, then retry."
    )


def call(what: str, fn, *args, missing: str | None = None):
    """Run a registry read; 'does not exist' becomes NotFoundError(`missing`), anything else names the outage."""
    try:
        return fn(*args)
    except Exception as err:
        if is_missing(err) and missing is not None:
            raise NotFoundError(missing) from None
        raise unavailable(err, what) from err


def registered_aliases(model: str) -> dict[str, str]:
    """MLflow's aliases of a registered model ({} when MLflow has no such model). On a database store one query
    of the alias table (MlflowClient's `get_registered_model` loads the model, its tags and latest versions
    too: most of a registry act's time); through a tracking server, the client's call."""
    c = client()._get_registry_client()
    store = c.store
    query = getattr(store, "_get_query", None)
    if query is not None and hasattr(store, "ManagedSessionMaker"):
        from mlflow.store.model_registry.dbmodels.models import SqlRegisteredModelAlias as Alias

        try:
            with store.ManagedSessionMaker() as session:
                rows = query(session, Alias).filter(Alias.name == model).all()
                return {row.alias: str(row.version) for row in rows}
        except Exception as err:
            raise unavailable(err, f"the aliases of registered model '{model}'") from err
    try:
        found = c.get_registered_model(model)
    except Exception as err:
        if is_missing(err):
            return {}
        raise unavailable(err, f"registered model '{model}'") from err
    return {a: str(v) for a, v in (found.aliases or {}).items()}


class Tracker(Protocol):
    run_id: str

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None: ...
    def log_dict(self, obj: Any, name: str) -> None: ...
    def close(self, status: str = "FINISHED", reason: str | None = None) -> None: ...


def default_tracking_uri() -> str:
    return f"sqlite:///{mlops_dir() / 'mlflow.db'}"


def tracking_uri() -> str:
    return os.environ.get(URI_ENV, "").strip() or default_tracking_uri()


def use_store(uri: str | None = None) -> str:
    """Point MLflow's process-wide tracking URI (which its fluent calls and the registry follow) at the configured
    store. Never `set_registry_uri`: MLflow writes it into MLFLOW_REGISTRY_URI, which then outlives the store."""
    import mlflow

    uri = uri or tracking_uri()
    mlflow.set_tracking_uri(uri)
    return uri


def display_uri(uri: str) -> str:
    """A URI without its password, for messages and tags."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.password:
        netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
        return urllib.parse.urlunsplit(parsed._replace(netloc=netloc))
    return uri


def default_artifact_location() -> str:
    return (mlops_dir() / "artifacts").as_uri()


def check_tracking_uri(uri: str, timeout: float = 5.0) -> None:
    """Fail fast, before any work, when the tracking backend cannot be reached."""
    parsed = urllib.parse.urlparse(uri)
    fix = f"Fix: start the server or set {URI_ENV} to a reachable store (unset it for the embedded SQLite default)."
    if parsed.scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
                if resp.status == 200:
                    return
        except OSError as err:
            raise TrackingError(f"tracking server {uri} is unreachable ({err}). {fix}") from None
        raise TrackingError(f"tracking server {uri} answered /health with an error. {fix}")
    if parsed.scheme.startswith("postgresql") or parsed.scheme.startswith("mysql"):
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 5432
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as err:
            raise TrackingError(f"tracking database {host}:{port} is unreachable ({err}). {fix}") from None
        return
    if parsed.scheme == "sqlite":
        path = Path(uri.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path.parent, os.W_OK):
            raise TrackingError(f"tracking database folder {path.parent} is not writable. {fix}")
        return
    if parsed.scheme in ("", "file"):
        return
    raise TrackingError(f"tracking URI '{uri}' has an unsupported scheme '{parsed.scheme}'. {fix}")


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def ensure_experiment(client, name: str, uri: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = default_artifact_location() if uri == default_tracking_uri() else None
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # created concurrently by another worker
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def init_experiment(name: str) -> tuple[str, str]:
    """(tracking URI, experiment id) after checking the store and creating the experiment if missing."""
    uri = tracking_uri()
    check_tracking_uri(uri)
    return uri, ensure_experiment(_client(uri), name, uri)


class MlflowTracker:
    """A run in MLflow. Metrics are sent asynchronously in batches so logging never stalls a step."""

    def __init__(self, client, run_id: str, uri: str) -> None:
        self.client = client
        self.run_id = run_id
        self.uri = uri
        self._closed = False

    @classmethod
    def start(
        cls,
        experiment: str,
        *,
        run_name: str | None = None,
        tags: Mapping[str, Any] | None = None,
        parent_run_id: str | None = None,
        resume_run_id: str | None = None,
        attach_env_run: bool = True,
    ) -> MlflowTracker:
        uri = tracking_uri()
        check_tracking_uri(uri)
        client = _client(uri)
        env_run = os.environ.get(RUN_ID_ENV) if attach_env_run else None
        run_id = resume_run_id or (env_run if not parent_run_id else None)
        if run_id:
            # `mlflow run` names its run at random ("resilient-kit-860"); the stage names it by what it does.
            rename = run_name if (run_name and run_id == env_run and not resume_run_id) else None
            client.update_run(run_id, status="RUNNING", name=rename)
        else:
            experiment_id = ensure_experiment(client, experiment, uri)
            run_tags = {"mlflow.runName": run_name} if run_name else {}
            if parent_run_id:
                run_tags["mlflow.parentRunId"] = parent_run_id
                run_tags[str(Tag.PARENT_RUN)] = parent_run_id
            run_id = client.create_run(experiment_id, tags=run_tags, run_name=run_name).info.run_id
        tracker = cls(client, run_id, uri)
        tracker.set_tags({**process_tags(), **(tags or {})})
        reap_once()
        return tracker

    @classmethod
    def existing(cls, run_id: str) -> MlflowTracker:
        """A handle on an existing run that leaves its status alone (to close a run whose process died)."""
        uri = tracking_uri()
        return cls(_client(uri), run_id, uri)

    def status(self) -> str:
        return self.client.get_run(self.run_id).info.status

    def delete_tags(self, names) -> None:
        existing = self.client.get_run(self.run_id).data.tags
        for name in names:
            if str(name) in existing:
                self.client.delete_tag(self.run_id, str(name))

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        fresh = [Param(str(k), str(v)[:6000]) for k, v in params.items() if str(k) not in existing]
        for i in range(0, len(fresh), 100):
            self.client.log_batch(self.run_id, params=fresh[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(str(k), float(v), now, int(step or 0)) for k, v in metrics.items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch, synchronous=False)

    log = log_metrics

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        batch = [RunTag(str(k), str(v)[:5000]) for k, v in tags.items() if v is not None]
        if batch:
            self.client.log_batch(self.run_id, tags=batch)

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_dict(self, obj: Any, name: str) -> None:
        self.client.log_dict(self.run_id, obj, name)

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def log_input(self, name: str, digest: str, source: str, context: str = "training") -> None:
        """Record a data snapshot as a dataset input of the run."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(name=name, digest=digest[:36], source_type="local", source=json.dumps({"uri": source}))
        self.client.log_inputs(self.run_id, [DatasetInput(dataset, [InputTag("mlflow.data.context", context)])])

    def log_hf_model(self, hf_dir: Path | str, name: str = "model", metadata: Mapping[str, Any] | None = None) -> str:
        """Log an HF folder as a pyfunc model of this run; returns its `runs:/` URI. `metadata` (e.g. the
        lineage tags) is stored in the model's MLmodel file."""
        import mlflow

        from mlops.hf_pyfunc import HF_ARTIFACT, HFChatModel

        use_store(self.uri)
        active = mlflow.active_run()
        if active is None or active.info.run_id != self.run_id:
            # Attach without the context manager: leaving it would end the run early.
            mlflow.start_run(run_id=self.run_id)
        mlflow.pyfunc.log_model(
            name=name,
            python_model=HFChatModel(),
            artifacts={HF_ARTIFACT: str(hf_dir)},
            pip_requirements=["mlops-llm", "torch==2.13.0", "transformers"],
            # MLmodel is YAML: keys must be plain strings (lineage Tag members are str enums).
            metadata={str(k): str(v) for k, v in metadata.items()} if metadata else None,
        )
        return f"runs:/{self.run_id}/{name}"

    def flush(self) -> None:
        import mlflow

        mlflow.flush_async_logging()

    def watch_system(self, interval: float):
        """MLflow's own system metrics on this run (`system/...`: CPU, memory, disk, network; GPU utilisation and
        memory through NVML where a GPU and pynvml are present), sampled every `interval` s by MLflow's monitor
        thread; returns the function that stops it."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(self.run_id, sampling_interval=interval, resume_logging=True,
                                       tracking_uri=self.uri)
        monitor.start()
        return monitor.finish

    def close(self, status: str = "FINISHED", reason: str | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self.flush()
        if reason:
            self.set_tags({Tag.FAILURE_REASON: reason})
        self.client.set_terminated(self.run_id, status=status)
        import mlflow

        active = mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            mlflow.end_run(status)


def process_tags() -> dict[str, str]:
    """Host and process of the run's owner, so `mlops tracking reap` can tell a dead run from a live one."""
    import psutil

    pid = os.getpid()
    return {Tag.HOST: socket.gethostname(), Tag.PID: str(pid),
            Tag.PROCESS_START: f"{psutil.Process(pid).create_time():.2f}"}


def mark_killed(run_id: str, reason: str, uri: str | None = None) -> None:
    """End a RUNNING run whose process is gone as KILLED, saying why (the reaper's only write)."""
    client = _client(uri or tracking_uri())
    client.set_tag(run_id, Tag.REAPED, reason[:4000])
    client.set_tag(run_id, Tag.FAILURE_REASON, reason[:4000])
    client.set_terminated(run_id, status="KILLED")


def reap(*, stale_after: float | None = 600.0, dry_run: bool = False) -> list[Reaped]:
    """Mark this store's dead RUNNING runs KILLED; returns what was (or, dry, would be) reaped."""
    c = client()
    experiments = [e.experiment_id for e in call("experiments", c.search_experiments)]
    if not experiments:
        return []
    running = call("running runs", lambda: c.search_runs(experiments, "attributes.status = 'RUNNING'",
                                                         max_results=5000))
    host, now, out = socket.gethostname(), time.time(), []
    for run in running:
        reason = death_reason(run.data.tags, host, now, stale_after)
        if reason is None:
            continue
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        full = f"reaped at {stamp}: {reason}; the run cannot finish (resume it by rerunning the same command)"
        if not dry_run:
            mark_killed(run.info.run_id, full)
        out.append(Reaped(run.info.run_id, run.info.experiment_id, full))
    return out


_REAPED = False


def reap_once() -> None:
    """Every stage, at its start, closes this host's runs whose process died (once per process, best effort)."""
    global _REAPED
    if _REAPED or os.environ.get("MLOPS_NO_REAP"):
        return
    _REAPED = True
    try:
        reap()
    except Exception as err:  # noqa: BLE001 - housekeeping must never stop the stage that starts
        import logging

        logging.getLogger(__name__).warning("could not reap dead runs: %s", err)


@contextmanager
def tracked_run(experiment: str, **kwargs: Any) -> Iterator[MlflowTracker]:
    """A run that is FINISHED on success and FAILED, with the reason as a tag, on any error."""
    tracker = MlflowTracker.start(experiment, **kwargs)
    try:
        yield tracker
    except BaseException as err:
        reason = str(err) if isinstance(err, MLOpsError) else f"{type(err).__name__}: {err}"
        if isinstance(err, KeyboardInterrupt):
            reason = "interrupted"
        tracker.close("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED", reason=reason[:4000])
        raise
    else:
        tracker.close("FINISHED")


class MemoryTracker:
    """An in-memory tracker for unit tests and dry runs."""

    def __init__(self, run_id: str = "memory") -> None:
        self.run_id = run_id
        self.params: dict[str, str] = {}
        self.metrics: list[tuple[int | None, dict[str, float]]] = []
        self.tags: dict[str, str] = {}
        self.artifacts: dict[str, Any] = {}
        self.status: str | None = None

    def log_params(self, params):
        self.params.update({str(k): str(v) for k, v in params.items()})

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, {str(k): float(v) for k, v in metrics.items()}))

    log = log_metrics

    def set_tags(self, tags):
        self.tags.update({str(k): str(v) for k, v in tags.items() if v is not None})

    def delete_tags(self, names):
        for name in names:
            self.tags.pop(str(name), None)

    def log_artifact(self, path, artifact_path=None):
        self.artifacts[str(Path(artifact_path or "") / Path(path).name)] = Path(path)

    def log_dict(self, obj, name):
        self.artifacts[name] = obj

    def log_text(self, text, name):
        self.artifacts[name] = text

    def log_input(self, name, digest, source, context="training"):
        self.artifacts[f"input:{name}"] = {"digest": digest, "source": source, "context": context}

    def log_hf_model(self, hf_dir, name="model", metadata=None):
        self.artifacts[name] = Path(hf_dir)
        if metadata:
            self.artifacts[f"{name}:metadata"] = dict(metadata)
        return f"memory:/{self.run_id}/{name}"

    def flush(self):
        pass

    def watch_system(self, interval: float):
        """No system metrics in memory; the stop function does nothing."""
        return lambda: None

    def close(self, status="FINISHED", reason=None):
        self.status = status
        if reason:
            self.tags[str(Tag.FAILURE_REASON)] = reason
