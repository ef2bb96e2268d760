"""End to end through the real CLI: two processes under ZeRO-2, universal resume 2 -> 1, SIGKILL (also
mid-save), SIGTERM to a two-process launcher (with a second trainer refused meanwhile), the two-process kill
drill, and `mlflow run`. Slow: each run starts fresh Python processes."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.drill import compare, read_trace
from training.testing import make_snapshot

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture
def env(mlops_home):
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "OMP_NUM_THREADS": "1", "MLOPS_HOME": str(mlops_home),
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "MLFLOW_TRACKING_URI": f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}"}


@pytest.fixture
def common(mlops_home, tiny_model):
    return [f"base_model={tiny_model['path']}", f"train.snapshot={make_snapshot()}", "train.max_steps=8",
            "train.checkpoint_every=2", "train.progress=false", "train.final_model=false"]


def mlops_train(env, args, nproc=1, check=True):
    cmd = [sys.executable, "-m", "mlops", "train", "run", "--config", str(REPO / "configs/train/tiny.yaml"),
           "--nproc", str(nproc), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def test_two_process_zero2_resume_is_bitwise_identical(env, common, tmp_path):
    zero2 = [*common, "train.zero_stage=2"]
    mlops_train(env, [*zero2, f"train.checkpoint.dir={tmp_path / 'ref'}"], nproc=2)
    crashed = mlops_train(env, [*zero2, f"train.checkpoint.dir={tmp_path / 'cut'}", "train.debug.crash_after_step=5"],
                          nproc=2, check=False)
    assert crashed.returncode != 0 and max(read_trace(tmp_path / "cut" / "trace.jsonl")) == 5
    mlops_train(env, [*zero2, f"train.checkpoint.dir={tmp_path / 'cut'}"], nproc=2)
    reference, resumed = read_trace(tmp_path / "ref" / "trace.jsonl"), read_trace(tmp_path / "cut" / "trace.jsonl")
    step, detail = compare(reference, resumed, 8)
    assert step is None, detail
    samples = [s for r in resumed.values() for s in r["samples"]]
    assert len(samples) == len(set(samples)) == 8 * 8  # global batch 8 (2 ranks x 2 x 2): one full epoch


QLORA = ["train.mode=qlora", 'train.lora.target_modules=["q_proj","k_proj","v_proj","o_proj","gate_proj",'
         '"up_proj","down_proj"]']


@pytest.mark.parametrize("mode", [[], QLORA], ids=["full", "qlora"])
def test_universal_checkpoint_resumes_two_processes_on_one(env, common, tmp_path, mode):
    run = [*common, *mode, "train.zero_stage=2", "train.global_batch_size=8", f"train.checkpoint.dir={tmp_path / 'u'}"]
    crashed = mlops_train(env, [*run, "train.debug.crash_after_step=5"], nproc=2, check=False)
    assert crashed.returncode != 0
    refused = mlops_train(env, run, nproc=1, check=False)
    assert refused.returncode == 2 and "train.checkpoint.universal=true" in refused.stderr
    done = mlops_train(env, [*run, "train.checkpoint.universal=true"], nproc=1)
    assert "FINISHED after 8 steps" in done.stdout and "step-00000004 at step 4" in done.stdout
    assert (tmp_path / "u" / "universal").is_dir()  # the converted copy is pruned along with its source
    trace = read_trace(tmp_path / "u" / "trace.jsonl")
    assert sorted(trace) == list(range(1, 9))
    samples = [s for r in trace.values() for s in r["samples"]]
    assert len(samples) == len(set(samples)) == 64


def test_sigkill_in_the_middle_of_a_save_resumes_from_the_previous_checkpoint(env, common, tmp_path):
    ckpt = tmp_path / "k"
    killed = mlops_train(env, [*common, f"train.checkpoint.dir={ckpt}", "train.debug.kill_in_save_step=6"],
                         check=False)
    assert killed.returncode == -9
    partial = ckpt / ".partial-step-00000006"  # written, never committed: no step-6 checkpoint exists
    assert partial.is_dir() and not (partial / "manifest.json").exists() and not (ckpt / "step-00000006").exists()
    mlops_train(env, [*common, f"train.checkpoint.dir={ckpt}"])
    assert not partial.exists()
    mlops_train(env, [*common, f"train.checkpoint.dir={tmp_path / 'ref'}"])
    step, detail = compare(read_trace(tmp_path / "ref" / "trace.jsonl"), read_trace(ckpt / "trace.jsonl"), 8)
    assert step is None, detail


def test_sigterm_to_a_two_process_launcher_checkpoints_every_rank_and_a_rerun_resumes(env, common, tmp_path):
    from mlflow.tracking import MlflowClient

    from mlops.lineage import Tag
    from training.checkpoint import list_tags, read_manifest
    from training.resume import read_ledger

    ckpt = tmp_path / "t"
    args = [*common, "train.zero_stage=2", f"train.checkpoint.dir={ckpt}", "train.checkpoint_every=1000"]
    cmd = [sys.executable, "-m", "mlops", "train", "run", "--config", str(REPO / "configs/train/tiny.yaml"),
           "--nproc", "2", *args, "train.max_steps=500"]  # long enough to be caught mid-run
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while max(read_trace(ckpt / "trace.jsonl") or {0: 0}) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    second = mlops_train(env, [*common, f"train.checkpoint.dir={ckpt}"], check=False)
    assert second.returncode == 2 and f"already training as pid {proc.pid} on host" in second.stderr
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, (tmp_path / "first.log").read_text()[-3000:]
    stopped = max(read_trace(ckpt / "trace.jsonl"))
    manifest = read_manifest(ckpt / f"step-{stopped:08d}")
    # No checkpoint_every step was reached, so the saves are the notice's (the newest) and each val_loss
    # improvement (the recipe selects on val_loss, and an improvement saves whatever checkpoint_every says); the
    # pruner keeps keep_last=2 of them plus the selection's best.
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    improvements, lowest = [], math.inf
    for m in sorted(client.get_metric_history(manifest["run_id"], "val_loss"), key=lambda m: m.step):
        if m.step <= stopped and m.value < lowest:
            improvements.append(m.step)
            lowest = m.value
    best = manifest["selection"]["step"]
    assert best == (improvements[-1] if improvements else None)
    kept = set(sorted({stopped, *improvements})[-2:]) | ({best} - {None})
    assert [s for s, _ in list_tags(ckpt)] == sorted(kept, reverse=True)
    assert manifest["world_size"] == 2 and len([f for f in manifest["files"] if "optim_states" in f]) == 2
    run = client.get_run(manifest["run_id"])
    assert run.info.status == "KILLED" and "SIGTERM" in run.data.tags[Tag.STOP_REASON]
    done = mlops_train(env, [*args, f"train.max_steps={stopped + 3}"], nproc=2)  # max_steps may change
    assert f"at step {stopped}" in done.stdout and f"FINISHED after {stopped + 3} steps" in done.stdout
    entry = read_ledger(ckpt)[-1]
    assert entry["step"] == stopped and entry["changes"]["train.max_steps"] == {"from": 500, "to": stopped + 3}
    assert sorted(read_trace(ckpt / "trace.jsonl")) == list(range(1, stopped + 4))


def test_two_process_kill_drill_passes_three_times_in_a_row_at_random_kill_steps(env, tiny_model):
    cmd = [sys.executable, "-m", "mlops", "train", "drill", "--config", str(REPO / "configs/train/tiny.yaml"),
           "--nproc", "2", "--steps", "8", f"base_model={tiny_model['path']}"]  # no --seed: a random kill step
    for attempt in range(3):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
        assert proc.returncode == 0, f"attempt {attempt + 1}: " + proc.stdout + proc.stderr[-4000:]
        last = proc.stdout.strip().splitlines()[-1]
        assert last.startswith("PASS: killed at step") and "every worker gone" in last and "resumed from step" in last


def test_mlflow_run_entry_point_trains_and_logs_the_model(env, common, tmp_path):
    from mlflow.tracking import MlflowClient

    from mlops.lineage import Tag

    overrides = " ".join([*common[:-1], f"train.checkpoint.dir={tmp_path / 'm'}", "train.max_steps=4"])
    cmd = ["mlflow", "run", "mlproject", "-e", "train", "--env-manager", "local", "-P",
           f"config={REPO / 'configs/train/tiny.yaml'}", "-P", f"overrides={overrides}", "-P", "nproc=1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    run_id = re.search(r"^run ([0-9a-f]{32}): FINISHED", proc.stdout, re.M).group(1)
    run = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(run_id)
    assert run.info.status == "FINISHED"
    for tag in (Tag.CONFIG_HASH, Tag.SNAPSHOT_ID, Tag.IMAGE_TAG, Tag.GIT_COMMIT, Tag.BASE_MODEL_ID, Tag.SEED,
                Tag.WORLD_SIZE, Tag.ZERO_STAGE, Tag.PROFILE_HASH):
        assert run.data.tags.get(tag), tag
    assert {"loss", "val_loss", "tokens_per_s", "mfu"} <= set(run.data.metrics)
    import mlflow

    from mlops.hf_pyfunc import hf_folder_in

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    local = mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model", dst_path=str(tmp_path / "dl"))
    assert (hf_folder_in(Path(local)) / "deployment_profile.yaml").exists()
