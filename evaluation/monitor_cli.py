"""`mlops monitor MODEL`: quality over time of a served model, read from the request log and the ledger.

The thin wrapper around `evaluation.monitor`: it reads the window's served answers (and the references': each
version's first days, the previous champion's), the release policy and the production history from the verified
ledger, prints a table or JSON, optionally writes Prometheus gauges for the node exporter's textfile collector
(`deploy/prometheus/alerts.yml` alerts on them), and exits for cron:

  0  quiet: every judged signal within its interval and tolerance
  1  an alert: a signal of the recent days is worse than a reference beyond the interval and the policy's tolerance
  2  bad input (an unknown model, a broken ledger, an unreadable store)
  3  no served traffic in the window (nothing judged, so nothing is called healthy)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from evaluation.monitor import DAY, QUANTILES, RATES, answers_of, champion_periods, previous_champion, report

EXIT_ALERT = 1
WIDTH = 17  # a rate with its interval: "27.5% [16.1-42.8]"


def ledger_view(model: str, url: str | None = None):
    """(policy.monitor, production periods) from the verified ledger; the defaults and none without a registry."""
    from registry.config import MonitorPolicy, policy_of, recorded_policy
    from registry.resolve import present

    if not present(url):
        return MonitorPolicy(), [], False
    from registry.ledger import verified

    entries = verified(url).entries
    policy = policy_of(recorded_policy(entries)).monitor
    return policy, champion_periods([e for e in entries if e.model == model]), True


def read_answers(model: str, *, days: int, policy, periods, now: float, url: str | None = None) -> list:
    """The window's served answers and the references' (each shown version's first days; the champions')."""
    from mlops.requestlog import read_feedback, read_requests

    rows = {r["request_id"]: r for r in read_requests(model=model, since=now - days * DAY, url=url)}
    versions = {str(r["version"]) for r in rows.values()}
    champions = (previous_champion(v, periods) for v in list(versions))  # however long ago they were displaced
    versions |= {c[0] for c in champions if c}
    for version in sorted(versions):
        for row in read_requests(model=model, version=version, url=url):
            rows.setdefault(row["request_id"], row)
    feedback = read_feedback(request_ids=list(rows), url=url) if rows else []
    return answers_of(list(rows.values()), feedback, window_seconds=policy.repeat_window_seconds,
                      similarity=policy.repeat_similarity)


def monitor_model(model: str, *, days: int, now: float | None = None, url: str | None = None) -> dict:
    now = time.time() if now is None else now
    policy, periods, governed = ledger_view(model)
    answers = read_answers(model, days=days, policy=policy, periods=periods, now=now, url=url)
    out = report(model, answers, policy=policy, periods=periods, now=now, days=days)
    out["policy"] = policy.model_dump(mode="json")
    if not governed:
        out["notices"].append("this store holds no registry: the default monitor policy applies and there is no "
                              "champion history (`mlops registry bootstrap` records one)")
    return out


def write_textfile(path: Path, result: dict) -> None:
    """Prometheus gauges for the node exporter's textfile collector, written atomically."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    reg = CollectorRegistry()
    alert = Gauge("mlops_monitor_alert", "1 when a signal of the recent days is worse than a reference beyond its "
                  "interval and the policy's tolerance", ["model", "version", "signal", "reference"], registry=reg)
    value = Gauge("mlops_monitor_signal", "a signal over the recent days (rates 0-1, latency in ms)",
                  ["model", "version", "signal"], registry=reg)
    ran = Gauge("mlops_monitor_last_run_timestamp_seconds", "when the monitor last judged the model", ["model"],
                registry=reg)
    model = result["model"]
    for version, entry in result["versions"].items():
        for name in RATES:
            if entry["recent"][name]["rate"] is not None:
                value.labels(model, version, name).set(entry["recent"][name]["rate"])
        for name in QUANTILES:
            if entry["recent"][name]:
                value.labels(model, version, name).set(entry["recent"][name]["value"])
        for reference in entry["references"]:
            for name in (*RATES, "latency_p95"):
                alert.labels(model, version, name, reference).set(0)
    for a in result["alerts"]:
        alert.labels(model, a["version"], a["signal"], a["reference"]).set(1)
    ran.labels(model).set(result["window"]["until"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), reg)


def _rate(cell: dict) -> str:
    if cell["rate"] is None:
        return "-"
    return f"{cell['rate'] * 100:4.1f}% [{cell['low'] * 100:.1f}-{cell['high'] * 100:.1f}]"


def _latency(cell: dict | None) -> str:
    return "-" if not cell else f"{cell['value']:.0f} [{cell['low']:.0f}-{cell['high']:.0f}]"


def text(result: dict) -> str:
    from mlops.text import shown

    cols = ("requests", *RATES, *QUANTILES)
    lines = [f"{shown(result['model'])}: the last {result['window']['days']} days (rates with "
             f"{result['policy']['confidence']:.0%} intervals; latency in ms)"]
    for version, entry in result["versions"].items():
        lines.append(f"\nv{shown(version)}")
        lines.append("  " + " | ".join(f"{c:>{WIDTH}}" for c in ("day", *cols)))
        rows = [(day, s) for day, s in entry["days"].items()]
        rows += [(f"recent {result['policy']['recent_days']}d", entry["recent"])]
        rows += [(f"{name} (v{shown(str(ref['version']))})", ref) for name, ref in entry["references"].items()]
        for label, s in rows:
            cells = [str(s["requests"]), *(_rate(s[n]) for n in RATES), *(_latency(s[n]) for n in QUANTILES)]
            lines.append("  " + " | ".join(f"{c:>{WIDTH}}" for c in (label, *cells)))
    for note in result["notices"]:
        lines.append(f"note: {shown(note)}")
    for a in result["alerts"]:
        now, ref = a["recent_interval"], a["reference_interval"]
        lines.append(f"ALERT v{shown(a['version'])} {a['signal']}: {a['recent']:.3g} [{now[0]:.3g}-{now[1]:.3g}] "
                     f"over the last {result['policy']['recent_days']} days vs {a['reference']} "
                     f"(v{shown(str(a['reference_version']))}) {a['reference_value']:.3g} "
                     f"[{ref[0]:.3g}-{ref[1]:.3g}]; tolerance {a['tolerance']} ({a['field']})")
    lines.append(f"{len(result['alerts'])} alert(s)")
    return "\n".join(lines)


def install(app: typer.Typer) -> None:
    app.command("monitor")(monitor_command)


def monitor_command(
    model: str = typer.Argument(..., help="registered model name, as serving answers under it"),
    days: int = typer.Option(14, "--days", min=1, max=3650, help="days of served traffic to show"),
    as_json: bool = typer.Option(False, "--json", help="the whole report as JSON"),
    textfile: Path | None = typer.Option(None, "--textfile", help="also write Prometheus gauges here (the node "
                                         "exporter's textfile collector reads *.prom files)"),
) -> None:
    """Quality over time per version and per day: thumbs-down, correction, refusal, repeated-question and error
    rates and latency, each with its interval, against the version's first week and the previous champion.
    Exit 0 quiet, 1 alert, 2 bad input, 3 no traffic in the window."""
    result = monitor_model(model, days=days)
    if textfile:
        write_textfile(textfile, result)
    typer.echo(json.dumps(result, indent=2) if as_json else text(result))
    if result["alerts"]:
        raise typer.Exit(EXIT_ALERT)
