"""The kill drill: an uninterrupted run and a run killed with SIGKILL at a random step then resumed must
produce the same trajectory: every step's loss and grad norm bit for bit, and the same sample ids."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mlops.errors import MLOpsError


@dataclass
class DrillReport:
    passed: bool
    kill_step: int
    killed_at: int | None  # the last step the killed run had traced
    first_divergence: int | None
    detail: str
    steps: int

    def summary(self) -> str:
        head = "PASS" if self.passed else "FAIL"
        where = "" if self.first_divergence is None else f"; first diverging step {self.first_divergence}"
        return (f"{head}: killed at step {self.killed_at} (target {self.kill_step}), resumed, "
                f"{self.steps} steps compared{where}. {self.detail}")


def read_trace(path: Path) -> dict[int, dict]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            out[record["step"]] = record
    return out


def compare(reference: dict[int, dict], candidate: dict[int, dict], steps: int) -> tuple[int | None, str]:
    """(first diverging step or None, explanation)."""
    seen: list[str] = []
    for step in range(1, steps + 1):
        a, b = reference.get(step), candidate.get(step)
        if a is None or b is None:
            return step, f"step {step} is missing from the {'reference' if a is None else 'resumed'} trace"
        for key in ("samples", "loss", "grad_norm"):
            if a[key] != b[key]:
                return step, f"{key} differs at step {step}: {a[key]!r} vs {b[key]!r}"
        seen += b["samples"]
    return None, f"losses and grad norms bitwise identical; {len(seen)} samples, none skipped or repeated"


def _command(config: Path | None, overrides: list[str], nproc: int, ckpt: Path, name: str) -> list[str]:
    cmd = [sys.executable, "-m", "mlops", "train", "run", "--nproc", str(nproc)]
    if config:
        cmd += ["--config", str(config)]
    return cmd + [*overrides, f"train.checkpoint.dir={ckpt}", f"run.run_name={name}"]


def _ensure_snapshot(config: Path | None, overrides: list[str]) -> list[str]:
    from mlops.cli_options import load

    cfg = load(config, overrides)
    if cfg.train is None or cfg.train.snapshot is None:
        from training.testing import make_snapshot

        return [*overrides, f"train.snapshot={make_snapshot()}"]
    return overrides


def run_drill(config: Path | None, overrides: list[str], *, nproc: int = 1, seed: int | None = None,
              steps: int = 12, work: Path | None = None, timeout: float = 900) -> DrillReport:
    from mlops.cli_options import split_overrides
    from mlops.paths import mlops_dir

    rng = random.Random(seed)
    kill_step = rng.randint(2, steps - 1)
    work = work or mlops_dir() / "drills" / time.strftime("%Y%m%d-%H%M%S")
    overrides = _ensure_snapshot(config, split_overrides(overrides))
    common = [*overrides, f"train.max_steps={steps}", "train.checkpoint_every=2", "train.final_model=false",
              "train.progress=false", "train.checkpoint.resume=auto"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    ref_dir, drill_dir = work / "reference", work / "killed"
    print(f"drill: reference run ({steps} steps) ...", flush=True)
    _run(_command(config, common, nproc, ref_dir, "drill-reference"), env, timeout)
    print(f"drill: run to be killed at step {kill_step} ...", flush=True)
    killed_at = _run_and_kill(_command(config, common, nproc, drill_dir, "drill-killed"), env, drill_dir,
                              kill_step, timeout)
    print(f"drill: killed after step {killed_at}; resuming ...", flush=True)
    _run(_command(config, common, nproc, drill_dir, "drill-killed"), env, timeout)
    step, detail = compare(read_trace(ref_dir / "trace.jsonl"), read_trace(drill_dir / "trace.jsonl"), steps)
    return DrillReport(step is None, kill_step, killed_at, step, detail, steps)


def _run(cmd: list[str], env: dict, timeout: float) -> None:
    proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    if proc.returncode != 0:
        raise MLOpsError(f"drill command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")


def _run_and_kill(cmd: list[str], env: dict, ckpt: Path, kill_step: int, timeout: float) -> int | None:
    ckpt.mkdir(parents=True, exist_ok=True)
    errors = ckpt.parent / "killed-run.log"
    with errors.open("w") as sink:  # a file, not a pipe: a full pipe would stall the child
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    trace = ckpt / "trace.jsonl"
    try:
        while time.monotonic() < deadline:
            traced = read_trace(trace)
            if traced and max(traced) >= kill_step:
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: launcher and every rank
                proc.wait()
                return max(read_trace(trace) or {0: None})
            if proc.poll() is not None:
                raise MLOpsError(f"the run to be killed ended first ({proc.returncode}): {errors.read_text()[-3000:]}")
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    raise MLOpsError(f"the drill run did not reach step {kill_step} within {timeout:.0f} s")
