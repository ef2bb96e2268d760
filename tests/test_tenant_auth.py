"""Per-team permissions on a real `mlflow server --app-name basic-auth` (one server for the module), and the pure
plan behind them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import in_ci

from mlops.errors import ConfigError
from mlops.tenant_auth import EXPERIMENT, MANAGE, MODEL, Grant, auth_config_text, plan_permissions

ADMIN, ADMIN_PW = "admin", "admin-Passw0rd-for-tests"
PASSWORDS = {"alice": "alice-Passw0rd-1", "bob": "bob-Passw0rd-22", "carol": "carol-Passw0rd-333",
             "dan": "dan-Passw0rd-4444"}
TEAMS = {"team-a": {"members": ["alice"]}, "team-b": {"members": ["bob"]}}


# --------------------------------------------------------------------------- the pure plan


def test_members_manage_their_own_team_experiments_and_nothing_else():
    plan = plan_permissions({"team-a": {"members": ["alice", "carol"]}, "team-b": {"members": ["bob"]}},
                            ["team-a/default", "team-a/sweeps", "team-b/default", "mlops", "team-c/default"], {})
    assert plan == sorted([Grant("alice", EXPERIMENT, "team-a/default", MANAGE),
                           Grant("alice", EXPERIMENT, "team-a/sweeps", MANAGE),
                           Grant("carol", EXPERIMENT, "team-a/default", MANAGE),
                           Grant("carol", EXPERIMENT, "team-a/sweeps", MANAGE),
                           Grant("bob", EXPERIMENT, "team-b/default", MANAGE)])


def test_a_registered_model_is_managed_by_its_owning_team_only():
    plan = plan_permissions(TEAMS, [], {"support-bot": "team-a"})
    assert plan == [Grant("alice", MODEL, "support-bot", MANAGE)]


def test_a_model_owned_by_an_undefined_team_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="team 'team-z'.*registry.teams does not define"):
        plan_permissions(TEAMS, [], {"support-bot": "team-z"})


@pytest.mark.parametrize("teams, message", [({"Team_A": {"members": ["alice"]}}, "not valid"),
                                            ({"team-a": {"members": []}}, "needs a list of user names")])
def test_a_bad_team_definition_is_refused(teams, message):
    with pytest.raises(ConfigError, match=message):
        plan_permissions(teams, ["team-a/default"], {})


def test_auth_config_denies_by_default_and_mlflow_reads_it(tmp_path, monkeypatch):
    from mlflow.server.auth.config import read_auth_config

    path = tmp_path / "basic_auth.ini"
    path.write_text(auth_config_text("sqlite:///auth.db", "root", "s3cret"))
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(path))
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_USERNAME", raising=False)
    cfg = read_auth_config()
    assert (cfg.default_permission, cfg.database_uri, cfg.admin_username, cfg.admin_password) == (
        "NO_PERMISSIONS", "sqlite:///auth.db", "root", "s3cret")
    assert "admin_password" not in auth_config_text("sqlite:///auth.db", "root", "")


def test_the_cli_reads_teams_from_the_release_policy_or_a_bare_file(tmp_path):
    from mlops.tenant_auth_cli import read_teams

    policy = tmp_path / "release.yaml"
    policy.write_text("registry:\n  spot_check: {required: false}\n  teams:\n    team-a:\n      members: [alice]\n"
                      "      quota_device_hours: 10\n")
    bare = tmp_path / "teams.yaml"
    bare.write_text("team-b: {members: [bob]}\n")
    assert read_teams(policy) == {"team-a": {"members": ["alice"]}}
    assert read_teams(bare) == {"team-b": {"members": ["bob"]}}


# --------------------------------------------------------------------------- a real basic-auth server


@contextlib.contextmanager
def acting_as(user: str, password: str):
    """MLflow's REST clients read the credentials from the environment at each request."""
    names = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    before = {n: os.environ.get(n) for n in names}
    os.environ.update(dict(zip(names, (user, password), strict=True)))
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        time.sleep(0.5)
    pytest.fail(f"mlflow server did not answer /health in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory, request):
    """The tracking server with the basic-auth app, deny by default; users alice, bob and carol exist."""
    try:
        import mlflow.server.auth  # noqa: F401 - the auth app and its extra (Flask-WTF)
    except ImportError as err:
        message = f"MLflow's auth app cannot be imported ({err}); install it with pip install 'mlflow[auth]'"
        if in_ci():
            pytest.fail(f"{message}. Under CI=true the tenant auth tests may not skip.")
        pytest.skip(message)
    from mlflow.server.auth.client import AuthServiceClient

    tmp = tmp_path_factory.mktemp("auth-server")
    ini = tmp / "basic_auth.ini"
    ini.write_text(auth_config_text(f"sqlite:///{tmp / 'auth.db'}", ADMIN, ADMIN_PW, cache_ttl_seconds=300))
    port, log = free_port(), tmp / "server.log"
    # No job runner: it forks seven huey consumers (GenAI scorer jobs), which this test never uses.
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                 "MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD"):
        env.pop(name, None)
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    with log.open("w") as out:
        proc = subprocess.Popen([str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port), "--workers",
                                 "1", "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
                                 "--default-artifact-root", str(tmp / "art"), "--app-name", "basic-auth"],
                                cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def stop():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the workers it forked: its own session
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    request.addfinalizer(stop)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log)
    with acting_as(ADMIN, ADMIN_PW):
        auth = AuthServiceClient(url)
        for user, password in PASSWORDS.items():
            auth.create_user(user, password)
    return url


@pytest.fixture(scope="module")
def first_sync(server):
    from mlops.tenant_auth import sync_permissions

    with acting_as(ADMIN, ADMIN_PW):
        return sync_permissions(server, TEAMS)


def experiment_id(url: str, name: str) -> str:
    from mlflow import MlflowClient

    with acting_as(ADMIN, ADMIN_PW):
        return MlflowClient(url).get_experiment_by_name(name).experiment_id


def log_a_run(url: str, user: str, experiment: str) -> str:
    from mlflow import MlflowClient

    with acting_as(user, PASSWORDS[user]):
        client = MlflowClient(url)
        run = client.create_run(experiment_id(url, experiment) if "/" in experiment else experiment)
        client.log_metric(run.info.run_id, "loss", 0.5)
        client.set_terminated(run.info.run_id)
        assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}
    return run.info.run_id


def assert_refused(fn, *args) -> None:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as caught:
        fn(*args)
    assert caught.value.error_code == "PERMISSION_DENIED", caught.value


def test_sync_creates_each_team_default_experiment_and_grants_its_members(server, first_sync):
    granted = {(c.action, c.user, c.resource) for c in first_sync if c.resource_type == EXPERIMENT}
    assert granted == {("grant", "alice", "team-a/default"), ("grant", "bob", "team-b/default")}


def test_member_logs_a_run_in_the_team_experiment(server, first_sync):
    log_a_run(server, "alice", "team-a/default")


def test_member_of_another_team_is_refused_on_the_team_experiment(server, first_sync):
    from mlflow import MlflowClient

    team_a = experiment_id(server, "team-a/default")
    alice_run = log_a_run(server, "alice", "team-a/default")
    with acting_as("bob", PASSWORDS["bob"]):
        client = MlflowClient(server)
        assert_refused(client.get_experiment, team_a)
        assert_refused(client.get_run, alice_run)
        assert_refused(client.create_run, team_a)
        assert_refused(client.log_metric, alice_run, "loss", 9.0)


def test_other_member_uses_its_own_team_experiment(server, first_sync):
    log_a_run(server, "bob", "team-b/default")


def test_a_second_sync_changes_nothing(server, first_sync):
    from mlops.tenant_auth import sync_permissions

    with acting_as(ADMIN, ADMIN_PW):
        assert sync_permissions(server, TEAMS) == []


def test_a_member_who_leaves_the_team_loses_its_grant(server, first_sync):
    from mlflow import MlflowClient

    from mlops.tenant_auth import sync_permissions

    joined = {**TEAMS, "team-a": {"members": ["alice", "carol"]}}
    with acting_as(ADMIN, ADMIN_PW):
        added = sync_permissions(server, joined)
    assert [(c.action, c.user, c.resource) for c in added] == [("grant", "carol", "team-a/default")]
    log_a_run(server, "carol", "team-a/default")
    joined["team-b"] = {"members": ["bob", "carol"]}
    joined["team-a"] = {"members": ["alice"]}
    with acting_as(ADMIN, ADMIN_PW):
        moved = sync_permissions(server, joined)
    assert sorted((c.action, c.user, c.resource) for c in moved) == [("grant", "carol", "team-b/default"),
                                                                     ("revoke", "carol", "team-a/default")]
    with acting_as("carol", PASSWORDS["carol"]):
        assert_refused(MlflowClient(server).create_run, experiment_id(server, "team-a/default"))
    log_a_run(server, "carol", "team-b/default")


def test_a_lower_grant_a_member_already_holds_is_raised_to_manage(server, first_sync):
    from mlflow import MlflowClient
    from mlflow.server.auth.client import AuthServiceClient

    from mlops.tenant_auth import sync_permissions

    team_b = experiment_id(server, "team-b/default")
    with acting_as(ADMIN, ADMIN_PW):
        AuthServiceClient(server).grant_user_permission("dan", EXPERIMENT, team_b, "READ")
    with acting_as("dan", PASSWORDS["dan"]):
        assert_refused(MlflowClient(server).create_run, team_b)  # READ: may look, not write
    with acting_as(ADMIN, ADMIN_PW):
        changes = sync_permissions(server, {**TEAMS, "team-b": {"members": ["bob", "dan"]}})
    assert [(c.action, c.user, c.resource, c.permission) for c in changes] == [
        ("update", "dan", "team-b/default", MANAGE)]
    log_a_run(server, "dan", "team-b/default")


def test_a_registered_model_trained_by_a_team_is_managed_by_that_team_only(server, first_sync):
    from mlflow import MlflowClient

    from mlops.tenant_auth import sync_permissions

    run_id = log_a_run(server, "alice", "team-a/default")
    with acting_as(ADMIN, ADMIN_PW):
        admin = MlflowClient(server)
        admin.create_registered_model("support-bot")
        admin.create_model_version("support-bot", f"runs:/{run_id}/model", run_id=run_id)
        changes = sync_permissions(server, TEAMS)
    assert [(c.action, c.user, c.resource_type, c.resource) for c in changes] == [
        ("grant", "alice", MODEL, "support-bot")]
    with acting_as("alice", PASSWORDS["alice"]):
        MlflowClient(server).set_registered_model_alias("support-bot", "candidate", "1")
    with acting_as("bob", PASSWORDS["bob"]):
        assert_refused(MlflowClient(server).get_registered_model, "support-bot")


def test_a_member_without_an_auth_user_is_named_with_the_fix(server, first_sync):
    from mlops.tenant_auth import sync_permissions

    with acting_as(ADMIN, ADMIN_PW), pytest.raises(ConfigError, match="'dave' has no user.*create_user"):
        sync_permissions(server, {**TEAMS, "team-c": {"members": ["dave"]}})


def test_sync_as_a_non_admin_is_refused_with_the_fix(server, first_sync):
    from mlops.errors import TrackingError
    from mlops.tenant_auth import sync_permissions

    with acting_as("alice", PASSWORDS["alice"]), pytest.raises(TrackingError, match="run as an admin"):
        sync_permissions(server, TEAMS)


def test_the_cli_syncs_the_teams_of_the_release_policy(server, first_sync, tmp_path):
    import json

    from typer.testing import CliRunner

    from mlops.tenant_auth_cli import app

    policy = tmp_path / "release.yaml"
    policy.write_text("registry:\n  teams:\n    team-a: {members: [alice], quota_device_hours: 10}\n"
                      "    team-b: {members: [bob], quota_device_hours: 10}\n")
    with acting_as(ADMIN, ADMIN_PW):
        out = CliRunner().invoke(app, ["sync-auth", "--teams", str(policy), "--tracking-uri", server, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == []
