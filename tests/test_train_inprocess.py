"""Training in this process on the tiny model: exact resume, guards, corrupt checkpoints, final model."""

from __future__ import annotations

import pytest

from mlops.lineage import Tag
from mlops.tracking import MemoryTracker
from training.checkpoint import MANIFEST, list_tags, read_manifest
from training.drill import compare, read_trace


@pytest.fixture
def make_cfg(make_train_cfg):
    return make_train_cfg


def run(cfg, tracker=None, **kwargs):
    from training.trainer import train

    tracker = tracker or MemoryTracker()
    return train(cfg, tracker, **kwargs), tracker


def trace(tmp_path, name):
    return read_trace(tmp_path / name / "trace.jsonl")


# Full fine-tuning resumes through the same code as LoRA; its heavier variant (~75 s) runs with the slow tests.
@pytest.mark.parametrize("mode,zero", [pytest.param("full", 0, marks=pytest.mark.slow), ("lora", 2)])
def test_resume_after_crash_is_bitwise_identical(make_cfg, tmp_path, mode, zero):
    from training.trainer import SimulatedCrash

    common = {"train.mode": mode, "train.zero_stage": zero}
    reference, _ = run(make_cfg("ref", **common, **{"train.final_model": False}))
    with pytest.raises(SimulatedCrash):
        run(make_cfg("cut", **common, **{"train.debug.crash_after_step": 5, "train.final_model": False}))
    assert max(trace(tmp_path, "cut")) == 5  # step 5 ran; the newest checkpoint is step 4
    resumed, tracker = run(make_cfg("cut", **common, **{"train.final_model": False}))
    assert tracker.tags[Tag.RESUMED_FROM].endswith("step-00000004")
    step, detail = compare(trace(tmp_path, "ref"), trace(tmp_path, "cut"), 8)
    assert step is None, detail
    samples = [s for r in trace(tmp_path, "cut").values() for s in r["samples"]]
    assert len(samples) == len(set(samples)) == 32  # 8 steps x 4, one epoch of 64: no repeats, none skipped
    assert resumed.metrics["val_loss"] == reference.metrics["val_loss"]


def test_nan_stops_before_the_step_without_a_bad_checkpoint(make_cfg, tmp_path):
    from training.guards import TrainingStopped

    tracker = MemoryTracker()
    with pytest.raises(TrainingStopped, match="before optimizer step 5: non-finite loss"):
        run(make_cfg("nan", **{"train.debug.nan_at_step": 5}), tracker)
    assert tracker.status == "FAILED" and "non-finite" in tracker.tags[Tag.FAILURE_REASON]
    incident = tracker.artifacts["incident.json"]
    assert incident["step"] == 5 and len(incident["sample_ids"]) == 4
    assert incident["last_good_checkpoint"].endswith("step-00000004")
    assert incident["last_metrics"]["loss"] > 0
    steps = [s for s, _ in list_tags(tmp_path / "nan")]
    assert max(steps) == 4 and max(trace(tmp_path, "nan")) == 4  # step 5 was never applied


def test_grad_norm_spike_stops_the_run(make_cfg):
    from training.guards import TrainingStopped

    tracker = MemoryTracker()
    cfg = make_cfg("spike", **{"train.debug.spike_at_step": 7, "train.guards.spike_factor": 10,
                               "train.guards.spike_warmup": 3, "train.grad_clip": 0})
    with pytest.raises(TrainingStopped, match="grad norm spike"):
        run(cfg, tracker)
    assert tracker.status == "FAILED" and tracker.artifacts["incident.json"]["step"] == 7


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_corrupt_shard_byte_falls_back_to_the_previous_checkpoint(make_cfg, tmp_path):
    from training.trainer import SimulatedCrash

    with pytest.raises(SimulatedCrash):
        run(make_cfg("c", **{"train.debug.crash_after_step": 6, "train.final_model": False}))
    newest = tmp_path / "c" / "step-00000006"
    shard = newest / "mp_rank_00_model_states.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    _, tracker = run(make_cfg("c", **{"train.final_model": False}))
    assert tracker.tags[Tag.RESUMED_FROM].endswith("step-00000004")
    assert read_manifest(tmp_path / "c" / "step-00000008") is not None


def test_final_model_is_a_merged_hf_folder_with_profile(make_cfg):
    from safetensors import safe_open

    from mlops.hf_pyfunc import hf_folder_in
    from mlops.profile import PROFILE_FILE, load_profile

    result, tracker = run(make_cfg("final", **{"train.mode": "lora", "train.max_steps": 4}))
    folder = hf_folder_in(result.model_dir)
    assert (folder / "model.safetensors").exists() and (folder / PROFILE_FILE).exists()
    assert (folder / "chat_template.jinja").exists() or "chat_template" in (folder / "tokenizer_config.json").read_text()
    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        assert not [k for k in fh.keys() if "lora" in k]  # merged: plain base-model weights only
    assert tracker.tags[Tag.PROFILE_HASH] == load_profile(folder).profile_hash()
    assert tracker.artifacts["model:metadata"][Tag.SNAPSHOT_ID] == tracker.tags[Tag.SNAPSHOT_ID]
    for tag in (Tag.CONFIG_HASH, Tag.SNAPSHOT_ID, Tag.IMAGE_TAG, Tag.GIT_COMMIT, Tag.BASE_MODEL_ID, Tag.SEED,
                Tag.WORLD_SIZE, Tag.ZERO_STAGE):
        assert tracker.tags[tag]
    assert tracker.tags[Tag.STAGE] == "train" and tracker.status == "FINISHED"
    assert {"config/resolved.yaml", "config/deepspeed.json", "plan.json"} <= set(tracker.artifacts)
    logged = {k for _, m in tracker.metrics for k in m}
    assert {"loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "data_wait_s", "peak_memory_bytes", "mfu",
            "val_loss", "val_perplexity"} <= logged
    assert not [k for k in logged if k.startswith("plan")]  # the plan's constants are params, not charts
    assert {"plan.flops_total", "plan.wall_time_s"} <= set(tracker.params)
    manifest = read_manifest(result.checkpoint)
    assert manifest["complete"] and manifest["files"] and manifest["run_id"] == tracker.run_id
    assert f"checkpoints/{result.checkpoint.name}/{MANIFEST}" in tracker.artifacts


def test_report_can_stop_training_cleanly(make_cfg):
    from training.trainer import StopTraining

    seen = []

    def report(step, metrics):
        seen.append((step, metrics["val_loss"]))
        raise StopTraining("pruned")

    result, tracker = run(make_cfg("stop"), report=report)
    assert result.stopped and result.steps == 4 and seen[0][0] == 4
    assert tracker.status == "FINISHED" and tracker.tags[Tag.STOP_REASON] == "pruned"


@pytest.mark.slow  # heavy end-to-end: the default run stays under 15 minutes; CI runs it
def test_smoke_run_passes_when_loss_falls_and_fails_under_the_throughput_floor(make_cfg):
    from training.final import SmokeFailed
    from training.prepare import prepare
    from training.trainer import train

    cfg = make_cfg("smoke", **{"train.smoke.steps": 20, "train.smoke.min_loss_drop": 0.02, "train.lr": 3e-3})
    tracker = MemoryTracker()
    result = train(cfg, tracker, prepared=prepare(cfg, smoke=True))
    assert result.steps == 20 and result.model_dir is None and tracker.tags[Tag.SMOKE] == "passed"
    assert result.metrics["loss_last"] < 0.98 * result.metrics["loss_first"]
    cfg = make_cfg("slow", **{"train.smoke.steps": 6, "train.smoke.min_tokens_per_s": 1e12})
    tracker = MemoryTracker()
    with pytest.raises(SmokeFailed, match="throughput .* under the floor"):
        train(cfg, tracker, prepared=prepare(cfg, smoke=True))
    assert tracker.status == "FAILED" and tracker.tags[Tag.SMOKE] == "failed"
