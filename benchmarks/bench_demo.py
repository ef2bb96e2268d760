"""A newcomer's first half hour, measured: a fresh clone's `make demo`, install included, timed part by part.

    .venv/bin/python benchmarks/bench_demo.py [--keep-caches] [--workdir DIR]

It clones this repository's committed HEAD into a temporary folder (uncommitted changes are not measured: it
says so), then, in the clone, with an empty pip cache and no llama.cpp build cached (both in the temporary
folder, unless --keep-caches), times `make demo` as a newcomer runs it: the Python install, then the loop, while
llama.cpp's one-time build goes on in the background until the demo's first deployment-form eval waits for it. The
split it prints: the Python install (until its stamp), where the llama.cpp build ended (its exit-status file), the
loop, and the loop's own steps from the demo's closing table (`.mlops/demo/timings.json` in the clone). The machine
(cores, CPU, load average before and after) is printed beside: only a run that started quiet is a figure for the
README.

Writes benchmarks/results/demo-<date>.{json,md}. Goal: install + loop <= 30 minutes (issue 44).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOAL_MIN = 30.0


def fresh_env(work: Path, keep_caches: bool) -> dict:
    """The shell of a newcomer: none of this project's variables; empty caches unless asked to keep them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLOPS_", "MLFLOW_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    if not keep_caches:
        env["PIP_CACHE_DIR"] = str(work / "pip-cache")
        env["MLOPS_LLAMACPP_CACHE"] = str(work / "llamacpp-cache")
    return env


def timed(cmd: list[str], cwd: Path, env: dict, log: Path) -> float:
    started = time.monotonic()
    with log.open("w") as fh:
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}); the last lines of {log}:\n"
                 + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    return time.monotonic() - started


def finished_at(path_glob: str, clone: Path, started: float) -> float | None:
    """When a file of the install was last written, in seconds from the start (a stamp, the build's exit status)."""
    found = sorted((clone / ".venv").glob(path_glob))
    return found[-1].stat().st_mtime - started if found else None


def cpu_model() -> str:
    """The CPU's name and whether it has AVX-512: a LoRA step of the demo took 4.9 s on the 2-core machine of the
    first figure and 8 s on a 2-core AMD EPYC without AVX-512, so a figure without its CPU says little."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    return f"{name}, {'AVX-512' if ' avx512f' in info else 'no AVX-512'}"


def measure(work: Path, keep_caches: bool) -> dict:
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    if dirty:
        print(f"note: uncommitted changes in {REPO} are not measured (the clone is of {commit})")
    clone = work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    env = fresh_env(work, keep_caches)
    load_before = os.getloadavg()
    print(f"{os.cpu_count()} cores ({cpu_model()}), load average before {load_before[0]:.2f}; clone of {commit} in "
          f"{clone}", flush=True)
    started = time.time()
    total = timed(["make", "demo"], clone, env, work / "demo.log")
    install = finished_at(".python-*", clone, started) or 0.0
    build = finished_at("llamacpp-build.rc", clone, started)
    steps = json.loads((clone / ".mlops" / "demo" / "timings.json").read_text())
    return {"date": time.strftime("%Y-%m-%d"), "commit": commit, "cores": os.cpu_count(), "cpu": cpu_model(),
            "load_before": load_before[0], "load_after": os.getloadavg()[0], "caches_kept": keep_caches,
            "install_s": install, "llamacpp_build_s": build, "loop_s": total - install, "total_s": total,
            "steps": steps, "goal_min": GOAL_MIN, "met": total / 60 <= GOAL_MIN}


def table(result: dict) -> str:
    m = 60.0
    lines = [f"`make demo` from a fresh clone of {result['commit']}, {result['date']}: {result['cores']} cores "
             f"({result.get('cpu', '?')}), "
             f"load average {result['load_before']:.2f} before, {result['load_after']:.2f} after; caches "
             f"{'kept' if result['caches_kept'] else 'empty (pip, llama.cpp)'}", "",
             "| part | minutes |", "|---|---|",
             f"| install (the Python side: venv, torch, `.[dev]`, the model wheels) | {result['install_s'] / m:.1f} |",
             f"| the loop (`scripts/demo.py`) | {result['loop_s'] / m:.1f} |",
             f"| ... llama.cpp's one-time build, in the background from the install's start, ended at | "
             f"{(result['llamacpp_build_s'] or 0) / m:.1f} |",
             f"| **all** | **{result['total_s'] / m:.1f}** (goal <= {GOAL_MIN:.0f}: "
             f"{'met' if result['met'] else 'MISSED'}) |", "", "| step | seconds |", "|---|---|"]
    for row in result["steps"]["steps"]:
        lines.append(f"| {row['step']} {row['title'][:80]} | {row['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep-caches", action="store_true", help="use this machine's pip and llama.cpp caches")
    parser.add_argument("--workdir", type=Path, help="where to clone (default: a new temporary folder)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    result = measure(work, args.keep_caches)
    text = table(result)
    print("\n" + text)
    out = REPO / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"demo-{result['date']}.json").write_text(json.dumps(result, indent=2))
    (out / f"demo-{result['date']}.md").write_text(text + "\n")
    print(f"\nsaved to {out / ('demo-' + result['date'])}.{{json,md}}; the clone stays in {work / 'clone'}")


if __name__ == "__main__":
    main()
