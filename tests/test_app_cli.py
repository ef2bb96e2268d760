"""`mlops app`: registered through the stage registry, settings from the `app:` section, refusals before start."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from mlops.errors import MLOpsError


@pytest.fixture
def with_app_stage(monkeypatch):
    """The installed stages plus the app's own entry point (pyproject's `app = "app.stage:register"`)."""
    import mlops.stages
    from app.stage import register

    installed = mlops.stages._entry_points()
    monkeypatch.setattr(mlops.stages, "_REGISTRY", None)
    monkeypatch.setattr(mlops.stages, "_entry_points", lambda: [*[(n, f) for n, f in installed if n != "app"],
                                                                ("app", lambda: register)])
    yield mlops.stages.load_stages()
    monkeypatch.setattr(mlops.stages, "_REGISTRY", None)


def test_the_app_stage_registers_its_config_section_and_the_mlops_app_command(with_app_stage, monkeypatch):
    import mlops.cli
    from app.config import AppConfig

    assert with_app_stage.sections["app"] is AppConfig
    assert with_app_stage.commands["app"] == "app.cli:install"
    root = typer.Typer()
    monkeypatch.setattr(mlops.cli, "app", root)
    mlops.cli._register_stages()
    result = CliRunner().invoke(root, ["app", "--help"])
    assert result.exit_code == 0 and "release-approval app" in result.output and "--port" in result.output


def test_settings_come_from_the_app_section_with_flags_on_top(with_app_stage, tmp_path):
    from app.cli import resolve_settings

    config = tmp_path / "app.yaml"
    config.write_text("app:\n  port: 9100\n  session_timeout_min: 5\n")
    cfg = resolve_settings(config, ["app.cache_ttl_s=2"], port=9200, address=None)
    assert (cfg.port, cfg.session_timeout_min, cfg.cache_ttl_s, cfg.address) == (9200, 5.0, 2.0, "127.0.0.1")
    with pytest.raises(MLOpsError, match="session_timeout"):
        resolve_settings(None, ["app.session_timeout=5"])


def test_the_streamlit_command_never_shows_a_traceback_and_sends_no_telemetry():
    from app.cli import streamlit_command
    from app.config import AppConfig

    cmd = streamlit_command(AppConfig(port=8765))
    flags = dict(zip(cmd[5::2], cmd[6::2], strict=False))
    assert cmd[3:5] == ["run", cmd[4]] and cmd[4].endswith("app/web/main.py")
    assert flags["--client.showErrorDetails"] == "none" and flags["--browser.gatherUsageStats"] == "false"
    assert flags["--server.port"] == "8765"


def test_a_tracking_server_without_a_named_ledger_database_is_refused_before_start(mlops_home, monkeypatch):
    from app.cli import preflight
    from registry.ledger import LedgerError

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    monkeypatch.delenv("MLOPS_REGISTRY_DB", raising=False)
    with pytest.raises(LedgerError, match="MLOPS_REGISTRY_DB"):
        preflight()


def test_a_store_without_a_registry_is_refused_before_start_and_not_created(mlops_home):
    from app.cli import preflight

    with pytest.raises(MLOpsError, match="does not exist .nothing was created.*bootstrap"):
        preflight()
    assert not (mlops_home / ".mlops" / "mlflow.db").exists()


def test_preflight_names_the_stores_the_app_will_use(mlops_home):
    from app.cli import preflight
    from registry.identities import bootstrap

    bootstrap("admin", "Trust-Root-2026", policy={})
    where = preflight()
    assert where["tracking"] == f"sqlite:///{mlops_home}/.mlops/mlflow.db" == where["ledger"]
    assert where["identities"] == "1 in the ledger"


def test_a_port_in_use_is_refused_with_the_fix(mlops_home):
    import socket

    from app.cli import _check_port_free
    from app.config import AppConfig

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(MLOpsError, match="--port with a free port"):
            _check_port_free(AppConfig(port=busy.getsockname()[1]))
