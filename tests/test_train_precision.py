"""Precision, ZeRO-3, activation checkpointing and offload on the tiny model: the DeepSpeed config each one
writes, runs that finish with a final model, exact resume, and bad combinations refused before compute."""

from __future__ import annotations

import pytest

from mlops.config import load_config
from mlops.errors import ConfigError
from mlops.lineage import Tag
from mlops.tracking import MemoryTracker
from training.drill import read_trace
from training.testing import check_bitwise_resume


@pytest.fixture
def make_cfg(make_train_cfg):
    return make_train_cfg


def run(cfg, **kwargs):
    from training.trainer import train

    tracker = MemoryTracker()
    return train(cfg, tracker, **kwargs), tracker


def test_deepspeed_config_spells_out_precision_and_offload():
    from training.engine import World, ds_config

    world = World(0, 2, 0, "cpu", "gloo")
    t = load_config(None, ["train.zero_stage=3", "train.offload=optimizer_and_params"]).train
    bf16 = ds_config(t, world, micro=2, accum=1, precision="bf16")
    assert bf16["bf16"] == {"enabled": True} and "fp16" not in bf16
    assert bf16["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert bf16["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert bf16["zero_force_ds_cpu_optimizer"] is False  # the torch AdamW, no CPUAdam build
    fp16 = ds_config(t, world, micro=2, accum=1, precision="fp16")
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0  # 0: dynamic loss scaling
    plain = ds_config(load_config(None, ["train.mode=lora"]).train, world, micro=2, accum=1)
    assert "bf16" not in plain and "fp16" not in plain and plain["zero_optimization"] == {"stage": 0}


@pytest.mark.parametrize(("overrides", "field"), [
    (["train.offload=optimizer_and_params", "train.zero_stage=2"], "train.offload=optimizer_and_params needs "
                                                                   "train.zero_stage=3"),
    (["train.offload=optimizer"], "train.offload=optimizer needs train.zero_stage >= 1"),
    (["train.precision=fp8"], "train.precision"),
    (["train.zero_stage=4"], "train.zero_stage"),
])
def test_combinations_that_cannot_run_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, overrides)


def test_fp16_on_cpu_is_refused_before_any_folder_or_run(make_cfg, tmp_path):
    from training.prepare import prepare

    with pytest.raises(ConfigError, match=r"train\.precision=fp16 cannot run on cpu"):
        prepare(make_cfg("f", **{"train.precision": "fp16"}))
    assert not (tmp_path / "f").exists()


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_activation_checkpointing_recomputes_the_same_losses_in_the_default_fp32(make_cfg, tmp_path):
    common = {"train.max_steps": 3, "train.final_model": False}
    result, tracker = run(make_cfg("plain", **common))
    assert result.status == "FINISHED" and tracker.tags[Tag.PRECISION] == "fp32"  # the CPU default
    assert tracker.tags[Tag.PLAN_VERDICT] == "fits"
    run(make_cfg("ckpt", **common, **{"train.activation_checkpointing": True}))
    plain, ckpt = read_trace(tmp_path / "plain" / "trace.jsonl"), read_trace(tmp_path / "ckpt" / "trace.jsonl")
    assert [plain[s]["loss"] for s in plain] == [ckpt[s]["loss"] for s in ckpt]


# bf16 at ZeRO-3 with the weights partitioned as they load, in one process (two: the slow tests and the drill).
@pytest.mark.slow  # heavy end-to-end: the default run stays under 15 minutes; CI runs it
def test_bf16_zero3_trains_and_gathers_one_hf_folder(make_cfg):
    import torch
    from transformers import AutoModelForCausalLM

    result, tracker = run(make_cfg(**{"train.zero_stage": 3, "train.precision": "bf16", "train.max_steps": 4}))
    assert result.status == "FINISHED" and tracker.tags[Tag.PRECISION] == "bf16"
    assert abs(result.metrics["loss"] - 10.83) < 0.1
    model = AutoModelForCausalLM.from_pretrained(result.model_dir)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("combo", [
    {"train.precision": "bf16"},  # ZeRO-0: DeepSpeed's bf16 wrapper over the torch AdamW
    {"train.precision": "bf16", "train.zero_stage": 2},
    {"train.zero_stage": 3, "train.mode": "lora"},
    {"train.zero_stage": 2, "train.offload": "optimizer"},
    {"train.zero_stage": 3, "train.offload": "optimizer_and_params", "train.precision": "bf16",
     "train.activation_checkpointing": True},
])
def test_each_lever_resumes_bitwise_after_a_crash(make_cfg, tmp_path, combo):
    common = {**combo, "train.final_model": False}
    check_bitwise_resume(make_cfg, tmp_path, **common)


def test_precision_cannot_change_within_a_training(make_cfg):
    from training.trainer import SimulatedCrash

    with pytest.raises(SimulatedCrash):
        run(make_cfg("p", **{"train.debug.crash_after_step": 2, "train.final_model": False}))
    with pytest.raises(ConfigError, match=r"train\.precision: null -> bf16"):
        run(make_cfg("p", **{"train.precision": "bf16", "train.final_model": False}))


@pytest.mark.slow
def test_two_process_kill_drill_passes_at_zero3_bf16(mlops_home, tiny_model):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLOPS_HOME": str(mlops_home),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
           "MLFLOW_TRACKING_URI": f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}"}
    cmd = [sys.executable, "-m", "mlops", "train", "drill", "--config", str(repo / "configs/train/tiny.yaml"),
           "--nproc", "2", "--steps", "8", f"base_model={tiny_model['path']}", "train.zero_stage=3",
           "train.precision=bf16"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("PASS: killed at step")
