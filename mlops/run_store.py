"""Reading runs back: find runs by their tags, load their JSON artifacts. Stages hand off through these, never
through printed output. Errors of the store are reported as outages, never as "nothing found"."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
from pathlib import Path

from mlops.tracking import call, client


def _quote(value: str) -> str:
    return str(value).replace("'", "\\'")


_VIEW: contextvars.ContextVar[dict | None] = contextvars.ContextVar("run_store_view", default=None)


@contextlib.contextmanager
def one_view():
    """Within it, the store's list of experiments is read once: one decision (a release act's gates) searches
    several kinds of runs and needs one consistent answer, not one round trip per search."""
    token = _VIEW.set({})
    try:
        yield
    finally:
        _VIEW.reset(token)


def _experiment_ids(c) -> list[str]:
    view = _VIEW.get()
    if view is not None and "experiments" in view:
        return view["experiments"]
    found = [e.experiment_id for e in call("experiments", c.search_experiments)]
    if view is not None:
        view["experiments"] = found
    return found


def find_runs(tags: dict[str, str], *, status: str | None = "FINISHED", having: tuple[str, ...] = (),
              max_results: int = 100) -> list:
    """Runs in any experiment carrying all `tags` (and every tag in `having`, any value), newest first."""
    c = client()
    experiments = _experiment_ids(c)
    if not experiments:
        return []
    clauses = [f"tags.`{k}` = '{_quote(v)}'" for k, v in tags.items()] + [f"tags.`{k}` LIKE '%'" for k in having]
    if status:
        clauses.append(f"attributes.status = '{status}'")
    query = " and ".join(clauses)
    return list(call("runs", lambda: c.search_runs(experiments, query, max_results=max_results,
                                                    order_by=["attributes.start_time DESC"])))


def latest_run(tags: dict[str, str], status: str = "FINISHED", having: tuple[str, ...] = ()) -> str | None:
    """Id of the newest run, in any experiment, carrying all `tags` (and every tag in `having`, any value)."""
    runs = find_runs(tags, status=status, having=having, max_results=1)
    return runs[0].info.run_id if runs else None


def get_run(run_id: str):
    return call(f"run {run_id}", client().get_run, run_id, missing=f"run {run_id} does not exist")


def load_run_json(run_id: str, artifact_path: str) -> dict:
    """A JSON artifact of a run (e.g. an eval run's `eval/summary.json`)."""
    return json.loads(load_run_text(run_id, artifact_path))


def load_run_text(run_id: str, artifact_path: str) -> str:
    """A text artifact of a run (a resolved config, a JSONL of samples); NotFoundError when it is not there."""
    import tempfile

    import mlflow

    from mlops.errors import NotFoundError
    from mlops.tracking import is_missing, tracking_uri, unavailable

    missing = f"run {run_id} has no artifact '{artifact_path}'"
    in_place = local_artifact(run_id, artifact_path)
    if in_place is not None:
        if not in_place.is_file():
            raise NotFoundError(missing)
        return in_place.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="mlops-artifact-") as tmp:
        try:
            local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path,
                                                        tracking_uri=tracking_uri(), dst_path=tmp)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(missing) from None
        except Exception as err:
            if is_missing(err):
                raise NotFoundError(missing) from None
            raise unavailable(err, f"artifact {artifact_path} of run {run_id}") from err
        return Path(local).read_text(encoding="utf-8")


def local_artifact(run_id: str, artifact_path: str) -> Path | None:
    """The artifact's own file when the run's artifacts live on this file system (the embedded default), read in
    place: MLflow's download would copy it into a temporary folder first, most of a registry act's time. None for
    remote artifact stores (a tracking server's `mlflow-artifacts:`, S3, ...), which are downloaded."""
    from urllib.parse import unquote, urlsplit

    from mlops.tracking import tracking_uri

    root = _artifact_root(tracking_uri(), run_id)
    parts = urlsplit(root)
    if parts.scheme not in ("", "file"):
        return None
    base = Path(unquote(parts.path) if parts.scheme else root).resolve()
    target = (base / artifact_path).resolve()
    return target if target.is_relative_to(base) else None


@functools.lru_cache(maxsize=4096)
def _artifact_root(store: str, run_id: str) -> str:
    """A run's artifact URI never changes once the run exists: asked of the store once per process."""
    return get_run(run_id).info.artifact_uri or ""
