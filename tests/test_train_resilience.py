"""How training survives the ways clusters fail, in this process on the tiny model: preemption notices, resumes
with changed settings, non-finite weights, all-corrupt checkpoints, a second trainer, a full disk, a kill
before the first checkpoint, and a resume at the last step."""

from __future__ import annotations

import errno
import os
import signal
import time

import pytest

from mlops.config import load_config
from mlops.errors import ConfigError
from mlops.lineage import Tag
from mlops.tracking import MemoryTracker
from training.checkpoint import list_tags, read_manifest, tag_for, verify
from training.drill import compare, read_trace
from training.testing import tiny_overrides


@pytest.fixture
def make_cfg(make_train_cfg):
    return lambda ckpt="a", **extra: make_train_cfg(ckpt, **{"train.final_model": False, **extra})


def run(cfg, tracker=None, **kwargs):
    from training.trainer import train

    tracker = MemoryTracker() if tracker is None else tracker
    return train(cfg, tracker, **kwargs), tracker


def mlflow_run(run_id: str):
    from mlflow import MlflowClient

    from mlops.tracking import tracking_uri

    return MlflowClient(tracking_uri=tracking_uri()).get_run(run_id)


def trace(tmp_path, name):
    return read_trace(tmp_path / name / "trace.jsonl")


# --------------------------------------------------------------------------- preemption


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_sigterm_saves_a_checkpoint_marks_run_killed_and_rerun_resumes_in_the_same_run(make_cfg, tmp_path):
    from training.stopping import Preempted, graceful_signals
    from training.trainer import train

    reference, _ = run(make_cfg("ref"))
    cfg = make_cfg("pre", **{"train.debug.sigterm_at_step": 3})
    with graceful_signals(), pytest.raises(Preempted, match="SIGTERM after step 3 of 8: checkpoint step-00000003") as err:
        train(cfg)
    assert err.value.exit_code == 143
    assert verify(tmp_path / "pre" / tag_for(3)) == (True, "")  # step 3 is no checkpoint step: the notice saved it
    run_id = read_manifest(tmp_path / "pre" / tag_for(3))["run_id"]
    killed = mlflow_run(run_id)
    assert killed.info.status == "KILLED" and "SIGTERM" in killed.data.tags[Tag.STOP_REASON]
    assert killed.data.tags[Tag.FAILURE_REASON] and killed.data.tags[Tag.HEARTBEAT]

    result = train(make_cfg("pre", **{"train.debug.sigterm_at_step": 3}))  # the same command again
    finished = mlflow_run(run_id)
    assert result.run_id == run_id and finished.info.status == "FINISHED"
    assert Tag.STOP_REASON not in finished.data.tags and Tag.FAILURE_REASON not in finished.data.tags
    step, detail = compare(trace(tmp_path, "ref"), trace(tmp_path, "pre"), 8)
    assert step is None, detail
    assert result.metrics["val_loss"] == reference.metrics["val_loss"]


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_sigterm_without_time_for_a_save_stops_at_once_and_resumes_from_the_previous_checkpoint(make_cfg, tmp_path):
    from training.stopping import Preempted, graceful_signals

    tracker = MemoryTracker()
    cfg = make_cfg("late", **{"train.debug.sigterm_at_step": 5, "train.checkpoint.grace_seconds": 0})
    with graceful_signals(), pytest.raises(Preempted, match="no checkpoint: a save takes about"):
        run(cfg, tracker)
    assert tracker.status == "KILLED" and "grace_seconds" in tracker.tags[Tag.STOP_REASON]
    assert [s for s, _ in list_tags(tmp_path / "late")][0] == 4
    _, resumed = run(make_cfg("late"))  # step 5 runs again: without the injected notice this time
    assert resumed.tags[Tag.RESUMED_FROM].endswith(tag_for(4)) and resumed.status == "FINISHED"


def test_second_ctrl_c_stops_at_once():
    from training.stopping import STOP, graceful_signals

    with graceful_signals() as stop, pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.name == "SIGINT"
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    assert not STOP.requested  # leaving the block forgets the notice


def test_worker_dies_within_seconds_when_its_launcher_is_killed(tmp_path):
    import subprocess
    import sys

    from training.stopping import pid_alive

    pid_file = tmp_path / "worker.pid"
    # Written whole, then renamed: the test polls for the file and must never read it empty.
    worker = ("import os, time, pathlib; from training.stopping import Watchdog; Watchdog(interval=0.2).start(); "
              f"pathlib.Path({str(pid_file)!r} + '.tmp').write_text(str(os.getpid())); "
              f"os.replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r}); time.sleep(60)")
    launcher = ("import os, subprocess, sys, time; from training.stopping import launcher_env; "
                f"subprocess.Popen([sys.executable, '-c', {worker!r}], env={{**os.environ, **launcher_env()}}, "
                "start_new_session=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", launcher], env=os.environ.copy())
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = pid_alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the worker outlived its launcher by 5 s"


# --------------------------------------------------------------------------- resume with changes


@pytest.mark.parametrize("mode,zero", [("full", 0), ("lora", 2)])
def test_lr_change_on_resume_is_applied_recorded_and_a_new_linked_run(make_cfg, tmp_path, mode, zero):
    from training.engine import lr_lambda
    from training.resume import read_ledger

    common = {"train.mode": mode, "train.zero_stage": zero}
    _, first = run(make_cfg("lr", **common, **{"train.max_steps": 4}), MemoryTracker("first"))
    cfg = make_cfg("lr", **common, **{"train.max_steps": 8, "train.lr": 5e-4, "train.lr_schedule": "linear"})
    _, second = run(cfg, MemoryTracker("second"))
    lr_at_5 = trace(tmp_path, "lr")[5]["lr"]
    assert lr_at_5 == pytest.approx(5e-4 * lr_lambda(cfg.train)(4), rel=1e-9)  # not the checkpoint's 1e-3 schedule
    entry = read_ledger(tmp_path / "lr")[-1]
    assert entry["step"] == 4 and entry["from_run"] == "first" and entry["run"] == "second"
    assert entry["changes"]["train.lr"] == {"from": 1e-3, "to": 5e-4}
    assert entry["changes"]["train.max_steps"] == {"from": 4, "to": 8}
    assert second.params["train.lr"] == "0.0005" and second.params["resumed_from_step"] == "4"
    assert second.tags[Tag.PREVIOUS_RUN] == "first"
    assert second.tags[Tag.CONFIG_HASH] != first.tags[Tag.CONFIG_HASH]
    assert "train.lr: 0.001 -> 0.0005" in second.tags[Tag.RESUME_CHANGES]
    assert second.artifacts["resume.json"]["resumes"][-1]["changes"]["train.lr"]["to"] == 5e-4


def test_changing_what_defines_the_job_is_refused_with_a_diff(make_cfg, tmp_path):
    _, first = run(make_cfg("mode", **{"train.max_steps": 2}))
    with pytest.raises(ConfigError, match=r"train\.mode: full -> lora.*train\.zero_stage: 0 -> 2"):
        run(make_cfg("mode", **{"train.max_steps": 4, "train.mode": "lora", "train.zero_stage": 2}))
    assert first.status == "FINISHED" and first.tags[Tag.TRAIN_MODE] == "full"
    assert [s for s, _ in list_tags(tmp_path / "mode")] == [2]  # nothing written by the refused run


def test_another_world_size_under_zero0_cannot_silently_change_the_global_batch(train_snapshot, tiny_model, tmp_path):
    from training.prepare import prepare

    def cfg(**extra):
        return load_config(None, tiny_overrides(train_snapshot, base_model=tiny_model["path"], **{
            "train.checkpoint.dir": str(tmp_path / "ws"), **extra}))

    from training.trainer import train

    train(cfg(**{"train.max_steps": 2, "train.final_model": False}), MemoryTracker())
    with pytest.raises(ConfigError, match=r"global batch \(sequences per optimizer step\): 4 -> 8.*"
                                          r"train.global_batch_size=4"):
        prepare(cfg(**{"train.max_steps": 4}), 2)
    replanned = prepare(cfg(**{"train.max_steps": 4, "train.checkpoint.replan_batch": True}), 2)
    assert replanned.changes["global batch (sequences per optimizer step)"] == (4, 8)
    replanned.release()
    kept = prepare(cfg(**{"train.max_steps": 4, "train.global_batch_size": 4}), 2)
    assert kept.accum == 1 and kept.global_batch == 4 and kept.resume_from is not None


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_smoke_runs_never_share_checkpoints_or_runs_with_real_runs(make_cfg, tmp_path):
    from training.prepare import prepare
    from training.trainer import train

    smoke_cfg = make_cfg("shared", **{"train.smoke.steps": 4, "train.smoke.min_tokens_per_s": 0})
    smoke = MemoryTracker("smoke")
    train(smoke_cfg, smoke, prepared=prepare(smoke_cfg, smoke=True))
    assert [s for s, _ in list_tags(tmp_path / "shared" / "smoke")] == [4, 2]
    _, real = run(make_cfg("shared", **{"train.max_steps": 6}), MemoryTracker("real"))
    assert Tag.RESUMED_FROM not in real.tags and min(trace(tmp_path, "shared")) == 1
    assert read_manifest(tmp_path / "shared" / tag_for(6))["run_id"] == "real"


# --------------------------------------------------------------------------- only finite state


@pytest.mark.parametrize("key,value,message", [("lr", "inf", "finite number"), ("lr", ".nan", "finite number"),
                                               ("lr", "1e39", "less than or equal to 1"),
                                               ("adam_betas", "[0.9, 1.0]", r"each beta must be in \[0, 1\)"),
                                               ("grad_clip", ".inf", "finite number")])
def test_non_finite_or_absurd_hyperparameters_are_refused_by_validation(key, value, message):
    with pytest.raises(ConfigError, match=rf"invalid value for 'train.{key}'.*{message}.*Fix: set `train.{key}`"):
        load_config(None, [f"train.{key}={value}"])


def test_weights_blown_up_by_a_step_stop_the_run_before_any_checkpoint_holds_them(make_cfg, tmp_path):
    import math

    import torch

    from training.guards import TrainingStopped

    tracker = MemoryTracker()
    with pytest.raises(TrainingStopped, match="after optimizer step 4, before any checkpoint of it: non-finite"):
        run(make_cfg("inf", **{"train.debug.inf_lr_at_step": 4}), tracker)
    assert tracker.status == "FAILED" and tracker.artifacts["incident.json"]["step_applied"] is True
    assert [s for s, _ in list_tags(tmp_path / "inf")] == [2]
    state = torch.load(tmp_path / "inf" / tag_for(2) / "mp_rank_00_model_states.pt", weights_only=False)
    assert all(math.isfinite(float(v.float().norm())) for v in state["module"].values())
    assert tracker.artifacts["incident.json"]["last_good_checkpoint"].endswith(tag_for(2))


def test_grad_norm_spike_rule_is_on_by_default(make_cfg):
    from training.guards import TrainingStopped

    tracker = MemoryTracker()
    with pytest.raises(TrainingStopped, match="grad norm spike"):
        run(make_cfg("spike", **{"train.max_steps": 12, "train.debug.spike_at_step": 12}), tracker)
    assert tracker.artifacts["incident.json"]["step"] == 12


# --------------------------------------------------------------------------- corrupt checkpoints, one writer, full disk


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_all_corrupt_checkpoints_are_refused_moved_aside_and_their_run_failed(make_cfg, tmp_path):
    from training.checkpoint import CorruptCheckpoints
    from training.trainer import SimulatedCrash, train

    with pytest.raises(SimulatedCrash):
        train(make_cfg("bad", **{"train.debug.crash_after_step": 4}))
    folder = tmp_path / "bad"
    run_id = read_manifest(folder / tag_for(4))["run_id"]
    for _, ckpt in list_tags(folder):
        shard = ckpt / "mp_rank_00_model_states.pt"
        shard.write_bytes(shard.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(CorruptCheckpoints, match=r"none of the 2 checkpoints.*step-00000004: .*sha256") as err:
        train(make_cfg("bad"))
    assert err.value.exit_code != 0 and not list_tags(folder)
    moved = sorted(p.name[: len(tag_for(0))] for p in (folder / "corrupt").iterdir())
    assert moved == [tag_for(2), tag_for(4)]  # set aside with a timestamp, never deleted
    failed = mlflow_run(run_id)
    assert failed.info.status == "FAILED" and "none of the 2 checkpoints" in failed.data.tags[Tag.FAILURE_REASON]
    result, _ = run(make_cfg("bad", **{"train.checkpoint.resume": "none"}))
    assert result.status == "FINISHED" and len(list((folder / "corrupt").iterdir())) == 2


def test_second_trainer_is_refused_and_a_stale_lock_taken_over(make_cfg, tmp_path, caplog):
    import json
    import socket

    from training.lock import LOCK_FILE, AlreadyTraining, TrainLock
    from training.prepare import prepare

    held = TrainLock(tmp_path / "two").acquire()
    try:
        with pytest.raises(AlreadyTraining, match=rf"already training as pid {os.getpid()} on host "
                                                  rf"{socket.gethostname()} since \d{{4}}-"):
            prepare(make_cfg("two"))
    finally:
        held.release()
    (tmp_path / "two" / LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "gone", "since": "then"}))
    with caplog.at_level("WARNING"):
        prep = prepare(make_cfg("two"))
    prep.release()
    assert "taking over the lock" in caplog.text and "pid 999999" in caplog.text


@pytest.mark.parametrize("where", ["shard", "manifest"])
def test_full_disk_mid_save_is_one_paragraph_and_keeps_the_previous_checkpoint(make_cfg, tmp_path, monkeypatch,
                                                                               where):
    import torch

    from training import saver
    from training.saver import CheckpointWriteError

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "shard":
        real_save = torch.save

        def save(obj, path, *args, **kwargs):
            if "step-00000004" in str(path):
                with open(path, "wb") as fh:
                    fh.write(b"half a shard")
                full()
            return real_save(obj, path, *args, **kwargs)

        monkeypatch.setattr(torch, "save", save)
    else:
        real_json = saver.atomic_json
        monkeypatch.setattr(saver, "atomic_json", lambda p, obj: full() if "step-00000004" in str(p)
                            else real_json(p, obj))
    tracker = MemoryTracker()
    with pytest.raises(CheckpointWriteError, match=r"writing checkpoint step-00000004 .* failed: the disk is full.*"
                                                  r"previous checkpoint step-00000002 is intact") as err:
        run(make_cfg("full"), tracker)
    assert "\n" not in str(err.value) and "Traceback" not in str(err.value)
    folder = tmp_path / "full"
    assert [s for s, _ in list_tags(folder)] == [2] and verify(folder / tag_for(2)) == (True, "")
    assert not [p for p in folder.iterdir() if p.name.startswith(".partial-")]
    assert tracker.status == "FAILED" and "disk is full" in tracker.tags[Tag.FAILURE_REASON]


# --------------------------------------------------------------------------- runs that died


@pytest.mark.slow  # heavy end-to-end: the default run stays under 15 minutes; CI runs it
def test_kill_before_the_first_checkpoint_leaves_no_orphan_running_run(make_cfg, tmp_path):
    import json

    from training.runs import RUN_FILE
    from training.trainer import SimulatedCrash, train

    with pytest.raises(SimulatedCrash):
        train(make_cfg("early", **{"train.debug.crash_after_step": 1}))
    orphan = json.loads((tmp_path / "early" / RUN_FILE).read_text())["run_id"]
    assert mlflow_run(orphan).info.status == "RUNNING" and not list_tags(tmp_path / "early")
    result = train(make_cfg("early"))
    old = mlflow_run(orphan)
    assert old.info.status == "KILLED" and "before its first checkpoint" in old.data.tags[Tag.FAILURE_REASON]
    assert mlflow_run(result.run_id).data.tags[Tag.PREVIOUS_RUN] == orphan and result.run_id != orphan


@pytest.mark.slow  # heavy end-to-end: the default run stays under 15 minutes; CI runs it
def test_resume_at_the_last_step_keeps_the_final_metrics(make_cfg, tmp_path):
    from training.trainer import SimulatedCrash

    reference, _ = run(make_cfg("ref"))
    with pytest.raises(SimulatedCrash):
        run(make_cfg("last", **{"train.debug.crash_after_step": 8}))
    resumed, tracker = run(make_cfg("last"))
    assert tracker.tags[Tag.RESUMED_FROM].endswith(tag_for(8)) and resumed.steps == 8
    assert resumed.metrics["val_loss"] == reference.metrics["val_loss"]
    assert resumed.metrics["val_perplexity"] == reference.metrics["val_perplexity"]
    assert resumed.metrics["loss"] == reference.metrics["loss"]
