"""Tracking: embedded SQLite default, failure marking, fail-fast on unreachable stores, PostgreSQL path."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mlops.errors import TrackingError
from mlops.lineage import Tag, collect_lineage
from mlops.tracking import MlflowTracker, check_tracking_uri, default_tracking_uri, tracked_run, tracking_uri


def client():
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri())


def test_embedded_default_is_sqlite_under_project_home(mlops_home):
    assert tracking_uri() == default_tracking_uri() == f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}"


def test_tracked_run_records_tags_params_metrics_and_artifacts(mlops_home, tmp_path):
    tags = collect_lineage("h" * 64, 3, base_model="tiny", snapshot_id="snap-x").as_tags()
    note = tmp_path / "note.txt"
    note.write_text("hello")
    with tracked_run("unit", run_name="r1", tags=tags) as run:
        run.log_params({"lr": 0.1})
        run.log_metrics({"loss": 1.5}, step=1)
        run.log_metrics({"loss": 1.0}, step=2)
        run.log_artifact(note, "notes")
        run.log_dict({"a": 1}, "d/a.json")
    stored = client().get_run(run.run_id)
    assert stored.info.status == "FINISHED"
    assert stored.data.tags[Tag.SNAPSHOT_ID] == "snap-x" and stored.data.params["lr"] == "0.1"
    history = [m.value for m in client().get_metric_history(run.run_id, "loss")]
    assert history == [1.5, 1.0]
    names = {a.path for a in client().list_artifacts(run.run_id, "notes")}
    assert names == {"notes/note.txt"}
    assert Path(stored.info.artifact_uri.removeprefix("file://")).is_relative_to(mlops_home / ".mlops")


def test_failed_run_is_marked_failed_with_reason(mlops_home):
    with pytest.raises(ValueError):
        with tracked_run("unit") as run:
            raise ValueError("disk on fire")
    stored = client().get_run(run.run_id)
    assert stored.info.status == "FAILED"
    assert stored.data.tags[Tag.FAILURE_REASON] == "ValueError: disk on fire"


def test_tracker_attaches_to_the_run_mlflow_run_created(mlops_home, monkeypatch):
    outer = MlflowTracker.start("unit", attach_env_run=False)
    monkeypatch.setenv("MLFLOW_RUN_ID", outer.run_id)
    with tracked_run("unit") as inner:
        inner.set_tags({Tag.STAGE: "smoke"})
    assert inner.run_id == outer.run_id
    assert client().get_run(outer.run_id).data.tags[Tag.STAGE] == "smoke"


from mlops.files import free_port  # noqa: E402


def test_unreachable_tracking_server_fails_fast_with_fix():
    with pytest.raises(TrackingError, match="unreachable.*Fix"):
        check_tracking_uri(f"http://127.0.0.1:{free_port()}", timeout=1)


def test_unreachable_tracking_database_fails_fast_with_fix():
    with pytest.raises(TrackingError, match="unreachable"):
        check_tracking_uri(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x", timeout=1)


def test_unknown_scheme_is_rejected():
    with pytest.raises(TrackingError, match="unsupported scheme"):
        check_tracking_uri("ftp://example/x")


@pytest.mark.slow  # heavy end-to-end: the default run stays under 15 minutes; CI runs it
@pytest.mark.postgres
def test_postgres_tracking_server_round_trip(postgres_url, tmp_path, monkeypatch):
    """A real `mlflow server` over PostgreSQL: log a lineage-tagged run, read it back over REST."""
    port = free_port()
    artifacts = tmp_path / "artifacts"
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", postgres_url,
         "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MLFLOW_TRACKING_URI": ""},
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                urllib.request.urlopen(uri + "/health", timeout=1)
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not become healthy in 90 s: " + (tmp_path / "server.log").read_text()[-3000:])
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
        tags = collect_lineage("p" * 64, 11, base_model="tiny", snapshot_id="snap-pg").as_tags()
        note = tmp_path / "lineage.json"
        note.write_text('{"ok": true}')
        with tracked_run("pg-e2e", tags=tags) as run:
            run.log_metrics({"loss": 0.5}, step=3)
            run.log_artifact(note)
        from mlflow.tracking import MlflowClient

        rest = MlflowClient(tracking_uri=uri)
        stored = rest.get_run(run.run_id)
        assert stored.info.status == "FINISHED"
        assert {k: stored.data.tags[k] for k in tags} == tags
        assert stored.data.metrics["loss"] == 0.5
        assert [a.path for a in rest.list_artifacts(run.run_id)] == ["lineage.json"]
        assert (artifacts.rglob("lineage.json").__next__()).read_text() == '{"ok": true}'
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_tracking_init_puts_experiment_artifacts_under_project_home(mlops_home):
    from mlops.tracking import init_experiment

    uri, experiment_id = init_experiment("demo")
    location = client().get_experiment(experiment_id).artifact_location
    assert uri == default_tracking_uri() and location == (mlops_home / ".mlops" / "artifacts").as_uri()
    assert init_experiment("demo") == (uri, experiment_id)


def test_a_run_started_by_mlflow_run_is_named_by_its_stage(mlops_home, monkeypatch):
    from mlops.tracking import client, init_experiment, tracked_run

    _, exp = init_experiment("naming")
    created = client().create_run(exp, run_name="resilient-kit-860").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", created)
    with tracked_run("naming", run_name="eval support-bot/2") as run:
        assert run.run_id == created
    assert client().get_run(created).info.run_name == "eval support-bot/2"
