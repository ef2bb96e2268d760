"""The kill drill: an uninterrupted run, and a run whose launcher is killed with SIGKILL at a random step (always
after its first checkpoint) and then resumed, must produce the same trajectory: every step's loss and grad norm
bit for bit, and the same sample ids. With several processes the drill also checks that no worker outlived its
launcher: a survivor would keep writing checkpoints under the resumed run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlops.errors import MLOpsError

CHECKPOINT_EVERY = 2


@dataclass
class DrillReport:
    passed: bool
    kill_step: int
    killed_at: int | None  # the last step the killed run had traced
    first_divergence: int | None
    detail: str
    steps: int
    resumed_from: int | None = None  # the step of the checkpoint the rerun resumed from
    survivors: list[int] = field(default_factory=list)  # worker pids still alive after the launcher died
    workers_gone_s: float | None = None  # how long the workers took to follow the launcher

    def summary(self) -> str:
        head = "PASS" if self.passed else "FAIL"
        where = "" if self.first_divergence is None else f"; first diverging step {self.first_divergence}"
        gone = ""
        if self.survivors:
            gone = f"; workers {self.survivors} outlived the launcher"
        elif self.workers_gone_s is not None:
            gone = f"; every worker gone {self.workers_gone_s:.1f} s after the launcher"
        resumed = f"resumed from step {self.resumed_from}" if self.resumed_from is not None else "did not resume"
        return (f"{head}: killed at step {self.killed_at} (target {self.kill_step}){gone}, {resumed}, "
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
    from mlops.config import load_config

    cfg = load_config(config, overrides)
    if cfg.train is None or cfg.train.snapshot is None:
        from training.synthetic import make_pair_snapshot, make_snapshot

        # A DPO drill needs pairs: the synthetic preference snapshot, as the chat drill gets the synthetic chats.
        snapshot = make_pair_snapshot() if cfg.train and cfg.train.objective == "dpo" else make_snapshot()
        return [*overrides, f"train.snapshot={snapshot}"]
    return overrides


def run_drill(config: Path | None, overrides: list[str], *, nproc: int = 1, seed: int | None = None,
              steps: int = 12, work: Path | None = None, timeout: float = 900,
              survivor_wait: float = 10.0) -> DrillReport:
    """`overrides` are `key=value` strings, already split."""
    from mlops.paths import mlops_dir
    from training.resume import read_ledger

    if steps < CHECKPOINT_EVERY + 2:
        raise MLOpsError(f"--steps {steps} leaves no room to kill after the first checkpoint (step "
                         f"{CHECKPOINT_EVERY}). Fix: pass --steps {CHECKPOINT_EVERY + 2} or more.")
    if seed is None:  # random, but said: a failing drill can be replayed with --seed
        seed = random.SystemRandom().randrange(1_000_000)
    rng = random.Random(seed)
    kill_step = rng.randint(CHECKPOINT_EVERY + 1, steps - 1)
    print(f"drill: seed {seed}, kill step {kill_step} (replay with --seed {seed})", flush=True)
    work = work or mlops_dir() / "drills" / time.strftime("%Y%m%d-%H%M%S")
    overrides = _ensure_snapshot(config, list(overrides))
    common = [*overrides, f"train.max_steps={steps}", f"train.checkpoint_every={CHECKPOINT_EVERY}",
              "train.final_model=false", "train.progress=false", "train.checkpoint.resume=auto"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    ref_dir, drill_dir = work / "reference", work / "killed"
    print(f"drill: reference run ({steps} steps, {nproc} process(es)) ...", flush=True)
    _run(_command(config, common, nproc, ref_dir, "drill-reference"), env, timeout)
    print(f"drill: run whose launcher is killed at step {kill_step} ...", flush=True)
    killed_at = _run_and_kill(_command(config, common, nproc, drill_dir, "drill-killed"), env, drill_dir,
                              kill_step, timeout)
    survivors, gone_s = _wait_for_workers(drill_dir, survivor_wait)
    print(f"drill: killed after step {killed_at}; resuming ...", flush=True)
    _run(_command(config, common, nproc, drill_dir, "drill-killed"), env, timeout)
    ledger = read_ledger(drill_dir)
    resumed_from = int(ledger[-1]["step"]) if ledger else None
    step, detail = compare(read_trace(ref_dir / "trace.jsonl"), read_trace(drill_dir / "trace.jsonl"), steps)
    passed = step is None and not survivors and resumed_from is not None and resumed_from >= CHECKPOINT_EVERY
    if resumed_from is None:
        detail += " The rerun did not resume from a checkpoint (no resume.json entry)."
    return DrillReport(passed, kill_step, killed_at, step, detail, steps, resumed_from, survivors, gone_s)


def _run(cmd: list[str], env: dict, timeout: float) -> None:
    proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    if proc.returncode != 0:
        raise MLOpsError(f"drill command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")


def _has_checkpoint(ckpt: Path) -> bool:
    from training.checkpoint import list_tags, read_manifest

    return any(read_manifest(folder) is not None for _, folder in list_tags(ckpt))


def _run_and_kill(cmd: list[str], env: dict, ckpt: Path, kill_step: int, timeout: float) -> int | None:
    """Start the run, wait for step `kill_step` and a complete checkpoint, then SIGKILL the launcher alone:
    its workers must follow it by themselves."""
    ckpt.mkdir(parents=True, exist_ok=True)
    errors = ckpt.parent / "killed-run.log"
    with errors.open("w") as sink:  # a file, not a pipe: a full pipe would stall the child
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    trace = ckpt / "trace.jsonl"
    try:
        while time.monotonic() < deadline:
            traced = read_trace(trace)
            if traced and max(traced) >= kill_step and _has_checkpoint(ckpt):
                os.kill(proc.pid, signal.SIGKILL)
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


def _wait_for_workers(ckpt: Path, wait: float) -> tuple[list[int], float | None]:
    """(pids of workers still alive after `wait` seconds, seconds until all were gone)."""
    from training.lock import live_workers, registered_workers

    if not registered_workers(ckpt):
        return [], None
    started = time.monotonic()
    while time.monotonic() - started < wait:
        if not live_workers(ckpt):
            return [], time.monotonic() - started
        time.sleep(0.05)
    survivors = [int(w["pid"]) for w in live_workers(ckpt)]
    for pid in survivors:  # leave nothing behind, but report them
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return survivors, None
