"""`mlops usage`: device-hours of training jobs per team, user, model and month."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

app = typer.Typer(help="Device-hours of training jobs per team, user, model and month (metered, not planned).")


@app.callback(invoke_without_command=True)
def usage(
    team: str = typer.Option("", help="only this team"),
    month: str = typer.Option("", help="only this UTC month (YYYY-MM)"),
    as_json: bool = typer.Option(False, "--json", help="print every job and the totals as JSON"),
    textfile: Path | None = typer.Option(None, help="also write Prometheus gauges to this file (node_exporter's "
                                         "textfile collector)"),
    address: str = typer.Option("", help="also count the jobs training now on this cluster (default: "
                                "RAY_ADDRESS, else the local head if one runs)"),
) -> None:
    """Metered device-hours (Ray Train's span of each job x its devices, restarts included)."""
    from mlops.errors import ConfigError
    from training.usage import all_rows, describe, prometheus_text, select
    from training.usage import as_json as to_json

    if month.strip() and not (len(month) == 7 and month[4] == "-" and month.replace("-", "").isdigit()):
        raise ConfigError(f"--month {month} is not YYYY-MM. Fix: pass e.g. --month 2026-12.")
    rows = select(all_rows(_live_jobs(address.strip())), team=team.strip() or None, month=month.strip() or None)
    typer.echo(json.dumps(to_json(rows), indent=2) if as_json else describe(rows))
    if textfile is not None:
        textfile.parent.mkdir(parents=True, exist_ok=True)
        tmp = textfile.with_suffix(textfile.suffix + ".tmp")
        tmp.write_text(prometheus_text(rows))
        os.replace(tmp, textfile)  # the collector never reads a half-written file


def _live_jobs(address: str) -> list:
    """The cluster's jobs where one is named or already running; never starts a head just to read it."""
    from training.ray_jobs import ClusterUnreachable, local_head_address, service_jobs

    address = address or os.environ.get("RAY_ADDRESS", "").strip() or local_head_address() or ""
    if not address:
        return []
    try:
        return service_jobs(address if "://" in address else f"http://{address}")
    except (ClusterUnreachable, OSError, RuntimeError, ValueError) as err:
        typer.echo(f"note: jobs training now are not counted: the cluster at {address} did not answer ({err})",
                   err=True)
        return []
