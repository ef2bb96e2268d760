"""`mlops app`: start the release-approval app on the configured tracking store and print its URL.

The app runs as `streamlit run app/web/main.py` in a child process; this module checks first that the tracking
store, the ledger database and the identities file can be used, so a misconfiguration is one plain paragraph
here rather than an error page in a browser.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import typer

from mlops.cli_options import ConfigOpt, OverridesArg
from mlops.errors import MLOpsError

ENTRY = Path(__file__).resolve().parent / "web" / "main.py"
ROOT = ENTRY.parents[2]


def streamlit_command(cfg) -> list[str]:
    """The Streamlit command line: headless, no telemetry, and never a traceback in the browser."""
    return [
        sys.executable, "-m", "streamlit", "run", str(ENTRY),
        "--server.address", cfg.address, "--server.port", str(cfg.port), "--server.headless", "true",
        "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false",
        "--client.showErrorDetails", "none", "--client.toolbarMode", "minimal", "--theme.base", "light",
    ]


def app_url(cfg) -> str:
    host = "127.0.0.1" if cfg.address in ("0.0.0.0", "::", "") else cfg.address
    return f"http://{host}:{cfg.port}"


def preflight() -> dict[str, str]:
    """Where the app will read and write, after checking each can be used (raises MLOpsError otherwise)."""
    from mlops.tracking import check_tracking_uri, display_uri, tracking_uri
    from registry.identities import list_users
    from registry.ledger import ledger_url

    uri = tracking_uri()
    ledger = ledger_url()  # a configuration error (a server URI without a ledger database) before any network
    check_tracking_uri(uri)
    users = list_users(ledger)  # the registry exists, this machine holds its key, and its ledger verifies
    if not users:
        raise MLOpsError("the registry lists nobody, so nobody could log in. Fix: `mlops registry bootstrap "
                         "--admin <name>`.")
    return {"tracking": display_uri(uri), "ledger": display_uri(ledger), "identities": f"{len(users)} in the ledger"}


def _check_port_free(cfg) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is no conflict
        try:
            sock.bind((cfg.address if cfg.address not in ("", "::") else "0.0.0.0", cfg.port))
        except OSError as err:
            raise MLOpsError(f"app.port {cfg.port} on {cfg.address} cannot be used ({err.strerror}). Fix: pass "
                             "--port with a free port, or stop what listens there.") from None


def serve_app(cfg, *, echo=typer.echo) -> int:
    """Run the app in the foreground until it stops (Ctrl-C stops it); returns its exit status."""
    from app.config import SETTINGS_ENV
    from mlops.tracking import tracking_uri

    where = preflight()
    _check_port_free(cfg)
    echo(f"Release-approval app: {app_url(cfg)}\n  tracking:   {where['tracking']}\n  ledger:     "
         f"{where['ledger']}\n  identities: {where['identities']}")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    # The app and every MLflow call in it use the store checked above, whatever the child's working directory.
    env = {**os.environ, SETTINGS_ENV: cfg.model_dump_json(), "PYTHONPATH": path,
           "MLFLOW_TRACKING_URI": tracking_uri(), "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    proc = subprocess.Popen(streamlit_command(cfg), env=env)
    # Stopping this process (Ctrl-C, SIGTERM from a supervisor) stops the app with it, never leaving it behind.
    forward = lambda signum, _frame: proc.send_signal(signum)  # noqa: E731
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def resolve_settings(config: Path | None, overrides: list[str] | None, **flags):
    """The `app:` section from a config file and overrides, with command-line flags on top."""
    from app.config import AppConfig
    from mlops.cli_options import load

    cfg = load(config, overrides) if (config or overrides) else None
    section = getattr(cfg, "app", None) or AppConfig()
    given = {k: v for k, v in flags.items() if v is not None}
    return AppConfig.model_validate({**section.model_dump(), **given}) if given else section


def app_command(
    port: int | None = typer.Option(None, "--port", help="port to listen on (app.port, default 8501)"),
    address: str | None = typer.Option(None, "--address", help="interface to listen on (app.address)"),
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
) -> None:
    """Start the release-approval app (Streamlit) on the configured tracking URI and print its URL."""
    code = serve_app(resolve_settings(config, overrides, port=port, address=address))
    raise typer.Exit(code)


def install(app: typer.Typer) -> None:
    """Add `mlops app` to the top-level CLI (called by the core's composition root)."""
    app.command("app")(app_command)


def main() -> None:
    """`python -m app`: the same command without the rest of the CLI."""
    standalone = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    standalone.command()(app_command)
    try:
        standalone()
    except MLOpsError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
