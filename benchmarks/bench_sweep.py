"""Sweep speed, measured side by side in one run on the tiny model.

1. Per-trial overhead: the same training run (same config, same final model) launched alone through the
   training stage, and run as a sweep trial (claim, sample, nested MLflow run, pruning reports, tell,
   heartbeats), alternating A/B/B/A. The trial's wall time is split into time inside the trainer and the
   sweep framework + tracking around it; the ratio (alone + framework) / alone is the overhead, robust to the
   noise of a shared machine. End-to-end ratios (min and median) are printed too. Goal: <= 1.05.
2. Workers: the same number of trials on one PostgreSQL study with one worker (`mlops sweep run`) and with
   two (`mlops sweep run` + `mlops sweep worker`), each configuration using all cores (torch threads =
   cores / workers). Reported: total wall time (process start, smoke check, trials) and the trial phase alone
   (first trial start to last trial end, from the study). Expectation on 2 cores: <= 0.65.

    python benchmarks/bench_sweep.py [--repeats 4] [--trials 6] [--pg postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TINY = REPO / "configs" / "train" / "tiny.yaml"
QUIET = lambda message: None  # noqa: E731


def base_overrides(model_path: str, snapshot: str, max_steps: int) -> list[str]:
    return [f"base_model={model_path}", f"train.snapshot={snapshot}", f"train.max_steps={max_steps}",
            "train.eval_every=4", "train.checkpoint_every=4", "train.progress=false", "train.lr=0.001",
            "train.smoke.min_tokens_per_s=0"]


def overhead(model_path: str, snapshot: str, repeats: int, max_steps: int, work: Path) -> dict:
    from mlops.config import load_config
    from training.prepare import prepare
    from training.sweep import runner as rn
    from training.sweep import storage as st
    from training.sweep.objective import StageTrainer, release_world
    from training.sweep.session import run_sweep
    from training.sweep.testing import sweep_yaml
    from training.trainer import train

    class TimedTrainer(StageTrainer):
        """The stage trainer, timing the time spent inside it (prepare + train), to split the trial's wall
        time into training and sweep framework."""

        inside: list[float] = []

        def train(self, cfg, tracker, report):
            started = time.perf_counter()
            try:
                return super().train(cfg, tracker, report)
            finally:
                self.inside.append(time.perf_counter() - started)

    overrides = base_overrides(model_path, snapshot, max_steps)
    path = sweep_yaml(work / "overhead.yaml", base=TINY, base_overrides=overrides, study="overhead",
                      params={"lr": {"key": "train.lr", "type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
                      pruner="none", n_trials=1, heartbeat_interval=10, enqueue=[{"lr": 0.001}])
    print("preparing: a one-trial sweep (smoke check, study, parent run) ...", flush=True)
    first = run_sweep(path, [], log=QUIET)  # warms every import and JIT, creates study and parent run
    plan = rn.stored_plan(rn.load_study(rn.open_study_storage(st.resolve_url()), "overhead"))
    store = rn.open_study_storage(st.resolve_url(), plan)
    study = rn.load_study(store, "overhead", plan, seed=plan.seed)
    trainer = TimedTrainer()
    ctx = rn.context(plan, study, trainer, parent_run_id=first.parent_run_id, experiment="sweep-overhead", log=QUIET)

    def alone(i: int) -> float:
        cfg = load_config(TINY, [*overrides, "run.experiment=sweep-overhead", f"train.checkpoint.dir={work / f'alone-{i}'}"])
        started = time.perf_counter()
        train(cfg, prepared=prepare(cfg, 1))  # what `mlops train run` does in one process
        return time.perf_counter() - started

    def trial(i: int) -> float:
        study.enqueue_trial({"lr": 0.001}, skip_if_exists=False)
        started = time.perf_counter()
        outcome = rn.work(ctx, store)
        elapsed = time.perf_counter() - started
        assert [o.state for o in outcome] == ["COMPLETE"], outcome
        return elapsed

    times: dict[str, list[float]] = {"alone": [], "trial": []}
    for i in range(repeats):
        for name, fn in ((("alone", alone), ("trial", trial)) if i % 2 == 0 else (("trial", trial), ("alone", alone))):
            times[name].append(fn(i))
            extra = f" (inside the trainer {trainer.inside[-1]:.2f} s)" if name == "trial" else ""
            print(f"  {name} run {i}: {times[name][-1]:.2f} s{extra}", flush=True)
    release_world()
    framework = [t - inside for t, inside in zip(times["trial"], trainer.inside, strict=True)]
    return {**times, "framework": framework}


def _database(admin_url: str) -> tuple[str, object]:
    import psycopg

    admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=3)
    name = f"mlops_bench_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    return f"{admin_url.rsplit('/', 1)[0]}/{name}", (admin, name)


def _drop(handle) -> None:
    admin, name = handle
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def sweep_wall(workers: int, url: str, sweep_file: Path, env: dict) -> tuple[float, float]:
    import optuna

    threads = str(max(1, (os.cpu_count() or 2) // workers))
    env = {**env, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    cmd = [sys.executable, "-m", "mlops", "sweep"]
    logs = [sweep_file.with_name(f"workers{workers}-{i}.log") for i in range(workers)]
    commands = [[*cmd, "run", "--config", str(sweep_file), "--storage", url]]
    commands += [[*cmd, "worker", "--study", "bench", "--storage", url, "--wait", "900"]] * (workers - 1)
    started = time.perf_counter()
    procs = [subprocess.Popen(c, env=env, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)
             for c, log in zip(commands, logs, strict=True)]
    for proc, log in zip(procs, logs, strict=True):
        if proc.wait(timeout=3600) != 0:
            for other in procs:
                if other.poll() is None:
                    other.kill()
            raise SystemExit(f"sweep process failed:\n{log.read_text()[-4000:]}")
    total = time.perf_counter() - started
    study = optuna.load_study(study_name="bench", storage=url.replace("postgresql://", "postgresql+psycopg://"))
    trials = study.get_trials()
    assert len(trials) == int(sweep_file.read_text().split("n_trials: ")[1].split()[0])
    phase = (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)).total_seconds()
    return total, phase


def workers_ratio(model_path: str, snapshot: str, n_trials: int, max_steps: int, admin_url: str, work: Path, home: Path):
    from training.sweep.testing import sweep_yaml

    sweep_file = sweep_yaml(work / "workers.yaml", base=TINY, study="bench", space="lr", params={}, pruner="none",
                            base_overrides=[*base_overrides(model_path, snapshot, max_steps), "train.final_model=false"],
                            n_trials=n_trials, heartbeat_interval=5)
    from training.engine import DIST_VARS

    clean = {k: v for k, v in os.environ.items() if k not in DIST_VARS}  # the in-process runs above set them
    env = {**clean, "MLOPS_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home / '.mlops' / 'mlflow.db'}",
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    from mlops.tracking import init_experiment

    init_experiment("sweep-bench")  # the tracking store exists before the first timed configuration
    runs: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    for workers in (1, 2, 2, 1):  # each configuration first once and last once: no order advantage
        url, handle = _database(admin_url)
        try:
            total, phase = sweep_wall(workers, url, sweep_file, env)
            runs[workers].append((total, phase))
            print(f"  {workers} worker(s): total {total:.1f} s, trial phase {phase:.1f} s", flush=True)
        finally:
            _drop(handle)
    return {w: tuple(statistics.mean(x) for x in zip(*r, strict=True)) for w, r in runs.items()}


def report_overhead(o: dict) -> None:
    med = {k: statistics.median(v) for k, v in o.items()}
    print(f"alone: median {med['alone']:.2f} s, min {min(o['alone']):.2f} s; trial: median {med['trial']:.2f} s, "
          f"min {min(o['trial']):.2f} s")
    print(f"sweep framework + tracking per trial (trial wall minus time inside the trainer): median "
          f"{med['framework']:.3f} s")
    print(f"per-trial overhead ratio, measured split: {(med['alone'] + med['framework']) / med['alone']:.3f}"
          "  (goal <= 1.05)")
    print(f"per-trial overhead ratio, end to end: min {min(o['trial']) / min(o['alone']):.3f}, "
          f"median {med['trial'] / med['alone']:.3f}  (noisy on a shared machine)")


def report_workers(results: dict) -> None:
    (one_total, one_phase), (two_total, two_phase) = results[1], results[2]
    print(f"two workers / one worker, total wall time: {two_total / one_total:.3f}  (expect <= 0.65 on 2 cores)")
    print(f"two workers / one worker, trial phase:     {two_phase / one_phase:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps per trial")
    parser.add_argument("--only", choices=("overhead", "workers"), help="run one of the two measurements")
    parser.add_argument("--pg", default=os.environ.get("MLOPS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    home = work / "home"
    home.mkdir()
    os.environ["MLOPS_HOME"] = str(home)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from mlops.base_models import import_base_model
    from training.testing import make_snapshot

    model = import_base_model("tiny", root=REPO / ".mlops" / "test-cache" / "models")["path"]
    snapshot = make_snapshot()
    if args.only != "workers":
        print(f"== per-trial overhead ({args.repeats} pairs, tiny model, {args.steps} steps, final model logged)")
        report_overhead(overhead(model, snapshot, args.repeats, args.steps, work))
    if args.only == "overhead":
        return
    print(f"== workers on PostgreSQL ({args.trials} trials, {args.steps} steps each, {os.cpu_count()} cores)")
    try:
        import psycopg

        psycopg.connect(args.pg, connect_timeout=3).close()
    except Exception as err:  # noqa: BLE001
        print(f"workers benchmark skipped: PostgreSQL at {args.pg} is unreachable ({err})")
        return
    report_workers(workers_ratio(model, snapshot, args.trials, args.steps, args.pg, work, home))


if __name__ == "__main__":
    main()
