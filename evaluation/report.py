"""Gate reports on disk: JSON for machines, a Markdown table (deltas and intervals) for people."""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.gate import GateReport
from mlops.files import atomic_write_text

ABSOLUTE = ("floor", "must_beat")  # rules whose interval is the challenger's own score, not a delta


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def to_markdown(report: GateReport) -> str:
    result = "PASSED" if report.passed else "FAILED"
    lines = [
        f"# Gate report: {result}",
        "",
        f"- challenger: `{report.challenger}`",
        f"- champion: `{report.champion or 'none (absolute floors)'}`",
        f"- past champions: {', '.join(f'`{h}`' for h in report.history) or 'none'}",
        f"- mode: {report.settings.get('mode')}, z = {report.settings.get('z')}, general margin = "
        f"{report.settings.get('general_margin')}, business margin = {report.settings.get('business_margin')}",
        f"- created: {report.created}",
        *[f"- note: {note}" for note in report.notes],
        "",
        "| check | against | rule | challenger | reference | delta | interval | result |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for c in report.checks:
        signed = c.rule not in ABSOLUTE
        interval = f"[{_num(c.lo, signed)}, {_num(c.hi, signed)}]" if c.lo is not None else "-"
        lines.append(
            f"| {c.name} | {c.against} | {c.rule} | {_num(c.challenger)} | {_num(c.reference)} | "
            f"{_num(c.delta, True)} | {interval} | {'pass' if c.passed else '**FAIL**'} |"
        )
    if report.reasons:
        lines += ["", "## Reasons", "", *[f"- {reason}" for reason in report.reasons]]
    return "\n".join(lines) + "\n"


def write_report(report: GateReport, folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / "gate_report.json", folder / "gate_report.md"
    atomic_write_text(json_path, json.dumps(report.as_dict(), indent=2, sort_keys=True))
    atomic_write_text(md_path, to_markdown(report))
    return json_path, md_path
