"""Runs that keep their best checkpoint (train.select), stop early when the metric stalls, score the business
suite on their own weights as they train (train.eval), and still resume bitwise after a kill."""

from __future__ import annotations

import json

import pytest

from mlops.errors import ConfigError
from mlops.lineage import Tag
from training.checkpoint import list_tags, read_manifest
from training.drill import compare, read_trace
from training.testing import run_tiny

# Evaluations every 2 steps, checkpoints only every 4: a selected step that is not a multiple of 4 proves the
# rule saved it because it was the best. min_delta=100 makes every evaluation after the first "no better".
STALLS = {"train.eval_every": 2, "train.checkpoint_every": 4, "train.select.metric": "val_loss",
          "train.select.patience": 2, "train.select.min_delta": 100.0}


def series(tracker, name: str) -> list[tuple[int, float]]:
    """One value per step (the run's closing metrics repeat the last evaluation's)."""
    return sorted(dict((step, m[name]) for step, m in tracker.metrics if name in m).items())


def test_the_final_model_is_the_selected_checkpoint_not_the_last(make_train_cfg, tmp_path):
    import torch
    from safetensors.torch import load_file

    from training.final import consolidated_state

    # With the validation loss falling, "max" picks the first evaluation: an early checkpoint, never the last.
    cfg = make_train_cfg("best", **{"train.eval_every": 2, "train.checkpoint_every": 8, "train.checkpoint.keep_last": 1,
                                    "train.select.metric": "val_loss", "train.select.mode": "max"})
    result, tracker = run_tiny(cfg)
    history = series(tracker, "val_loss")
    best_step, best_value = max(history, key=lambda h: h[1])
    assert [s for s, _ in history] == [2, 4, 6, 8] and best_step != 8
    assert tracker.tags[Tag.SELECTED_STEP] == str(best_step) and float(tracker.tags[Tag.SELECTED_VALUE]) == best_value
    assert tracker.tags[Tag.SELECTED_METRIC] == "val_loss max"
    chosen = tmp_path / "best" / f"step-{best_step:08d}"
    assert result.checkpoint == chosen and tracker.tags[Tag.SELECTED_CHECKPOINT] == str(chosen)
    # keep_last=1 would have deleted it: the selected best outlives retention, next to the newest.
    assert {s for s, _ in list_tags(tmp_path / "best")} == {best_step, 8}
    assert tracker.artifacts["model:metadata"][Tag.SELECTED_STEP] == str(best_step)
    assert result.metrics["selected_step"] == best_step and result.metrics["selected_val_loss"] == best_value
    weights = load_file(str(result.model_dir / "model.safetensors"))
    state = consolidated_state(chosen, 0)
    name = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(weights[name], state[name].float())
    final = json.loads((tmp_path / "best" / "final.json").read_text())
    assert final["selection"]["step"] == best_step and final["checkpoint"] == str(chosen)


def test_early_stopping_ends_a_stalled_run_at_its_best_and_says_why(make_train_cfg, tmp_path):
    result, tracker = run_tiny(make_train_cfg("stall", **STALLS, **{"train.final_model": False}))
    assert result.status == "FINISHED" and result.steps == 6  # evaluations at 2 (best), 4 and 6 (patience 2)
    assert tracker.status == "FINISHED"
    reason = tracker.tags[Tag.EARLY_STOPPED]
    assert "early stopping at step 6" in reason and "train.select.patience=2" in reason and "step 2" in reason
    assert tracker.tags[Tag.STOP_REASON] == reason and tracker.tags[Tag.SELECTED_STEP] == "2"
    assert result.checkpoint == tmp_path / "stall" / "step-00000002"
    assert max(read_trace(tmp_path / "stall" / "trace.jsonl")) == 6  # no step ran after the stop
    again, _ = run_tiny(make_train_cfg("stall", **STALLS, **{"train.final_model": False}))
    assert again.steps == 6  # a rerun of a finished, early-stopped run trains nothing


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_a_killed_run_resumes_to_the_same_best_and_stops_at_the_same_step(make_train_cfg, tmp_path):
    from training.trainer import SimulatedCrash

    common = {**STALLS, "train.final_model": False}
    reference, ref_tracker = run_tiny(make_train_cfg("ref", **common))
    with pytest.raises(SimulatedCrash):
        run_tiny(make_train_cfg("cut", **common, **{"train.debug.crash_after_step": 5}))
    resumed, tracker = run_tiny(make_train_cfg("cut", **common))
    assert tracker.tags[Tag.RESUMED_FROM].endswith("step-00000004")
    assert (resumed.steps, tracker.tags[Tag.SELECTED_STEP], tracker.tags[Tag.SELECTED_VALUE]) == (
        reference.steps, ref_tracker.tags[Tag.SELECTED_STEP], ref_tracker.tags[Tag.SELECTED_VALUE])
    step, detail = compare(read_trace(tmp_path / "ref" / "trace.jsonl"), read_trace(tmp_path / "cut" / "trace.jsonl"), 6)
    assert step is None, detail
    assert tracker.tags[Tag.EARLY_STOPPED] == ref_tracker.tags[Tag.EARLY_STOPPED]


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_every_checkpoint_manifest_carries_the_evaluations_of_its_step(make_train_cfg, tmp_path):
    result, tracker = run_tiny(make_train_cfg("m", **{"train.eval_every": 4, "train.checkpoint_every": 2,
                                                      "train.checkpoint.keep_last": 4, "train.final_model": False,
                                                      "train.select.metric": "val_loss"}))
    by_step = dict(series(tracker, "val_loss"))
    manifests = {s: read_manifest(p) for s, p in list_tags(tmp_path / "m")}
    assert manifests[2]["eval"] == {}  # nothing evaluated yet
    assert manifests[4]["eval"]["val_loss"] == {"step": 4, "value": by_step[4]}
    assert manifests[6]["eval"]["val_loss"] == {"step": 4, "value": by_step[4]}  # the latest, with its own step
    assert manifests[8]["eval"]["val_loss"] == {"step": 8, "value": by_step[8]}
    assert manifests[8]["selection"]["metric"] == "val_loss" and manifests[8]["selection"]["mode"] == "min"


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_the_business_suite_is_scored_during_the_run_without_changing_its_training(make_train_cfg, tmp_path):
    plain, _ = run_tiny(make_train_cfg("plain", **{"train.final_model": False}))
    cfg = make_train_cfg("biz", **{"train.final_model": False, "train.eval.suites": "[business]",
                                   "train.eval.every": 4, "train.eval.limit": 1,
                                   "train.select.metric": "train_eval.business"})
    scored, tracker = run_tiny(cfg)
    suite = series(tracker, "train_eval.business")
    assert [s for s, _ in suite] == [4, 8] and all(0.0 <= v <= 1.0 for _, v in suite)
    task = next(k for _, m in tracker.metrics for k in m if k.startswith("train_eval.biz_refunds_returns_mc")
                and not k.endswith(("ci_low", "ci_high")))
    low, value, high = (dict(series(tracker, f"{task}{end}"))[8] for end in (".ci_low", "", ".ci_high"))
    assert low <= value <= high
    assert all(v > 0 for _, v in series(tracker, "train_eval_s"))
    assert tracker.tags[Tag.SELECTED_METRIC] == "train_eval.business max"
    # The eval ran on the live weights between steps and left no trace on the training itself.
    step, detail = compare(read_trace(tmp_path / "plain" / "trace.jsonl"), read_trace(tmp_path / "biz" / "trace.jsonl"), 8)
    assert step is None, detail
    assert scored.metrics["val_loss"] == plain.metrics["val_loss"]


def test_bad_selection_settings_name_the_field_and_the_fix(make_train_cfg):
    from training.prepare import prepare

    with pytest.raises(ConfigError, match=r"train.select.patience=3 needs a metric.*train.select.metric"):
        make_train_cfg("x", **{"train.select.patience": 3})
    with pytest.raises(ConfigError, match=r"'accuracy' is not a metric.*val_loss, val_perplexity"):
        make_train_cfg("x", **{"train.select.metric": "accuracy"})
    with pytest.raises(ConfigError, match=r"train.select.metric=train_eval.business is not measured.*train.eval.suites"):
        prepare(make_train_cfg("x", **{"train.select.metric": "train_eval.business"}), 1, lock=False)
    with pytest.raises(ConfigError, match="did you mean"):
        prepare(make_train_cfg("x", **{"train.eval.suites": "[busines]"}), 1, lock=False)


def test_configs_without_selection_keep_their_hash_and_selection_changes_it(make_train_cfg):
    from mlops.config import config_hash

    plain = config_hash(make_train_cfg("h"))
    assert config_hash(make_train_cfg("h", **{"train.select.metric": "null", "train.eval.suites": "[]"})) == plain
    assert config_hash(make_train_cfg("h", **{"train.select.metric": "val_loss"})) != plain
    assert config_hash(make_train_cfg("h", **{"train.signals.textfile": "/tmp/x.prom"})) == plain


def test_the_plan_counts_the_in_run_evals_time(make_train_cfg, tiny_model):
    from training import hardware
    from training.planner import describe, plan_job

    def plan(**extra):
        return plan_job(make_train_cfg("p", **{"train.max_steps": 100, **extra}), hw=hardware.named("l4"),
                        base_path=tiny_model["path"])

    plain = plan()
    every_10 = plan(**{"train.eval.suites": "[business]", "train.eval.every": 10})
    every_50 = plan(**{"train.eval.suites": "[business]", "train.eval.every": 50})
    assert plain["inrun_eval_s"] == 0 and every_10["inrun_eval_s"] == pytest.approx(5 * every_50["inrun_eval_s"])
    assert every_10["wall_time_s"] == pytest.approx(plain["wall_time_s"] + every_10["inrun_eval_s"])
    assert "in-run eval" in describe(every_10)


@pytest.mark.slow
def test_two_processes_at_zero3_score_the_gathered_weights_and_agree_on_the_best(mlops_home, tiny_model, tmp_path):
    """Under ZeRO-3 each rank holds a shard: the eval gathers the whole weights, rank 0 scores them and every rank
    takes the same decision (a rank that disagreed would hang the next collective, or save alone)."""
    import os
    import subprocess
    import sys

    from mlops.run_store import get_run
    from tests.conftest import REPO
    from training.testing import make_snapshot

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLOPS_HOME": str(mlops_home),
           "MLFLOW_TRACKING_URI": f"sqlite:///{mlops_home / '.mlops' / 'mlflow.db'}"}
    args = [f"base_model={tiny_model['path']}", f"train.snapshot={make_snapshot()}", "train.max_steps=6",
            "train.zero_stage=3", "train.progress=false", "train.final_model=false", "train.eval.suites=[business]",
            "train.eval.every=2", "train.eval.limit=1", "train.select.metric=train_eval.business",
            "train.select.patience=1", f"train.checkpoint.dir={tmp_path / 'z3'}"]
    done = subprocess.run([sys.executable, "-m", "mlops", "train", "run", "--config", "configs/train/tiny.yaml",
                           "--nproc", "2", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    run = get_run(json.loads((tmp_path / "z3" / "run.json").read_text())["run_id"])
    assert run.info.status == "FINISHED" and 0.0 <= run.data.metrics["train_eval.business"] <= 1.0
    selected = int(run.data.tags[Tag.SELECTED_STEP])
    assert run.data.tags[Tag.SELECTED_CHECKPOINT].endswith(f"step-{selected:08d}")
    assert (tmp_path / "z3" / f"step-{selected:08d}").is_dir()
