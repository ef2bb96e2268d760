"""Run every benchmark and write what it printed, with the machine it ran on: `make bench`.

Each `benchmarks/bench_*.py` runs in its own process, one after the other (they measure side by side inside
themselves; running two at once would make both meaningless on a small machine). Written:
  benchmarks/results/<date>.json   per benchmark: command, exit code, seconds, load average before and after,
                                   its full output, and the lines that state a goal (met or MISSED)
  benchmarks/results/<date>.md     the same as a summary: machine, versions, goal lines, misses marked
  benchmarks/RESULTS.md            a copy of the newest summary (what the README links to)

    python benchmarks/report.py                      # every benchmark with its own defaults
    python benchmarks/report.py --only registry,shadow --args "registry=--iterations 10"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOAL = re.compile(r"\b(goal|met|MISSED|miss(ed)?|target)\b", re.IGNORECASE)
MISS = re.compile(r"\bMISS(ED)?\b")


def machine() -> dict:
    from importlib import metadata

    versions = {}
    for name in ("torch", "deepspeed", "mlflow", "lm_eval", "optuna", "streamlit", "transformers"):
        try:
            versions[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            versions[name] = None
    mem = None
    if Path("/proc/meminfo").exists():
        first = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
        mem = round(int(first[1]) / 2**20, 1)
    return {"host": platform.node(), "cpu_count": os.cpu_count(), "memory_gib": mem,
            "platform": platform.platform(), "python": platform.python_version(), "versions": versions}


def goal_lines(output: str) -> list[str]:
    """Lines that state a goal, with the section headers (`== name`) that say which setting they belong to."""
    return [line.strip() for line in output.splitlines() if GOAL.search(line) or line.startswith("== ")]


def run_one(script: Path, extra: list[str], timeout: float) -> dict:
    cmd = [sys.executable, str(script), *extra]
    before, started = os.getloadavg(), time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=HERE.parent)
        code, output = proc.returncode, proc.stdout
        if proc.returncode:
            output += f"\n[stderr tail]\n{proc.stderr[-3000:]}"
    except subprocess.TimeoutExpired as err:  # its partial output comes back as bytes even in text mode
        code, output = "timeout", err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else ""
    goals = goal_lines(output)
    shown = ["python", os.path.relpath(script, HERE.parent), *extra]
    return {"benchmark": script.stem, "command": " ".join(shlex.quote(c) for c in shown), "exit_code": code,
            "seconds": round(time.perf_counter() - started, 1), "load_before": [round(x, 2) for x in before],
            "load_after": [round(x, 2) for x in os.getloadavg()], "goals": goals,
            "missed": [g for g in goals if MISS.search(g)], "output": output}


def render(report: dict) -> str:
    m = report["machine"]
    lines = [f"# Benchmark results, {report['date']}", "",
             f"Written by `python benchmarks/report.py` (`make bench`). Machine: {m['host']}, {m['cpu_count']} cores, "
             f"{m['memory_gib']} GiB, {m['platform']}, Python {m['python']}; "
             + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v) + ".", "",
             "Each benchmark measures its ratios side by side inside one run; load averages (1/5/15 min) are "
             "printed because on a shared 2-core machine only runs that start quiet are comparable. Lines that "
             "state a goal are quoted as the benchmark printed them; **MISSED** marks a goal not met.", "",
             "| benchmark | exit | seconds | load before → after | goals missed |", "| --- | --- | --- | --- | --- |"]
    for r in report["results"]:
        lines.append(f"| {r['benchmark']} | {r['exit_code']} | {r['seconds']} | {r['load_before'][0]} → "
                     f"{r['load_after'][0]} | {len(r['missed'])} of {sum(not g.startswith('==') for g in r['goals'])} goal lines |")
    for r in report["results"]:
        lines += ["", f"## {r['benchmark']}", "", f"`{r['command']}`", ""]
        lines += [f"\n**{g.strip('= ')}**\n" if g.startswith("==") else f"- {'**MISSED** ' if MISS.search(g) else ''}`{g}`"
                  for g in r["goals"]] or ["- (no goal lines)"]
        if r["exit_code"] not in (0, "0"):
            lines += ["", f"Exit code {r['exit_code']}: the full output is in the JSON file."]
    not_run = report.get("not_run")
    if not_run:
        lines += ["", f"Not run this time: {', '.join(not_run)} (see `--only`)."]
    return "\n".join(lines) + "\n"


def settle(limit_s: float) -> None:
    """Wait (up to `limit_s`) for the 1-minute load average to fall below half the cores: a benchmark that starts
    while the previous one's processes still weigh on the machine measures them too."""
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1) and time.monotonic() < deadline:
        time.sleep(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated names (registry, shadow, ...); default: all")
    parser.add_argument("--args", action="append", default=[], help='extra arguments, e.g. "registry=--iterations 10"')
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per benchmark")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--settle", type=float, default=180, help="seconds to wait for a quiet machine before each")
    args = parser.parse_args(argv)
    scripts = sorted(HERE.glob("bench_*.py"))
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = wanted - {s.stem.removeprefix("bench_") for s in scripts}
    if unknown:
        parser.error(f"--only names unknown benchmarks {sorted(unknown)}; available: "
                     f"{', '.join(s.stem.removeprefix('bench_') for s in scripts)}")
    extra = dict(a.split("=", 1) for a in args.args)
    chosen = [s for s in scripts if not wanted or s.stem.removeprefix("bench_") in wanted]
    date = time.strftime("%Y-%m-%d")
    report = {"date": date, "machine": machine(), "results": [],
              "not_run": [s.stem for s in scripts if s not in chosen]}
    for script in chosen:
        settle(args.settle)
        print(f"== {script.name}", flush=True)
        result = run_one(script, shlex.split(extra.get(script.stem.removeprefix("bench_"), "")), args.timeout)
        print("\n".join(result["goals"]) or "(no goal lines)", flush=True)
        report["results"].append(result)
    earlier = args.out / f"{date}.json"
    if earlier.exists():  # keep today's earlier results of the benchmarks not run now
        ran = {r["benchmark"] for r in report["results"]}
        kept = [r for r in json.loads(earlier.read_text())["results"] if r["benchmark"] not in ran]
        report["results"] = sorted(kept + report["results"], key=lambda r: r["benchmark"])
        report["not_run"] = [n for n in report["not_run"] if n not in {r["benchmark"] for r in kept}]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{date}.json").write_text(json.dumps(report, indent=2) + "\n")
    summary = render(report)
    (args.out / f"{date}.md").write_text(summary)
    (HERE / "RESULTS.md").write_text(summary)
    print(f"wrote {args.out / (date + '.json')}, {args.out / (date + '.md')} and {HERE / 'RESULTS.md'}")
    return 0 if all(r["exit_code"] == 0 for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
