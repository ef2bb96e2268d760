"""Sweep studies with a fake trainer (same contract as training.trainer.train), real MLflow and Optuna stores:
nesting and lineage, pruning, crashes, smoke refusal, resume, workers, heartbeats, best trial."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mlops.errors import ConfigError, MLOpsError
from mlops.lineage import Tag
from training.sweep.testing import FakeTrainer, MemoryRuns, sweep_yaml

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "train" / "tiny.yaml"
QUIET = lambda message: None  # noqa: E731


@pytest.fixture
def snapshot(mlops_home) -> str:
    from training.testing import make_snapshot

    return make_snapshot(train=8, validation=4, seq_len=16)


def write_sweep(tmp_path: Path, snapshot: str, **sweep) -> Path:
    overrides = [f"train.snapshot={snapshot}", "train.max_steps=12", "train.eval_every=2"]
    settings = {"pruner": {"name": "median", "n_startup_trials": 1}, "n_trials": 4, "heartbeat_interval": 1, **sweep}
    return sweep_yaml(tmp_path / "sweep.yaml", base=TINY, base_overrides=overrides, **settings)


def client():
    from mlflow import MlflowClient

    from mlops.tracking import tracking_uri

    return MlflowClient(tracking_uri=tracking_uri())


def children(parent_id: str) -> dict[str, object]:
    c = client()
    parent = c.get_run(parent_id)
    runs = c.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    return {r.info.run_name: r for r in runs}


def sweep(tmp_path, snapshot, trainer, overrides=(), runs=None, **kw):
    """A sweep with the fake trainer; `runs=MemoryRuns()` keeps its runs in memory (faster than MLflow)."""
    from training.sweep.session import run_sweep

    return run_sweep(write_sweep(tmp_path, snapshot, **kw), list(overrides), trainer=trainer, start_tracker=runs,
                     log=QUIET)


def test_sweep_prunes_nests_lineage_tagged_trials_and_survives_a_crash(mlops_home, tmp_path, snapshot):
    from mlops.config import load_config

    trainer = FakeTrainer(crash_calls=(3,))
    summary = sweep(tmp_path, snapshot, trainer, n_trials=5, enqueue=[{"lr": 3e-3}, {"lr": 1e-4}])
    states = [o.state for o in summary.outcomes]
    assert len(states) == 5 and states[:3] == ["COMPLETE", "PRUNED", "FAIL"], states
    assert "SimulatedCrash" in summary.outcomes[2].reason
    assert summary.best["number"] == 0 and summary.best["params"] == {"lr": 3e-3}

    runs = children(summary.parent_run_id)
    assert set(runs) == {"unit-smoke", *(f"unit-trial-{i}" for i in range(5))}
    for i, cfg in enumerate([c for c in trainer.calls]):
        run = runs[f"unit-trial-{i}"]
        tags = run.data.tags
        assert tags[Tag.PARENT_RUN] == summary.parent_run_id and tags[Tag.SWEEP_TRIAL] == str(i)
        assert tags[Tag.SNAPSHOT_ID] == snapshot and tags[Tag.IMAGE_TAG] and tags[Tag.GIT_COMMIT]
        assert cfg.run.experiment == "sweep-unit" and cfg.train.lr == float(run.data.params["sweep.lr"])
        from mlops.config import config_hash

        assert tags[Tag.CONFIG_HASH] == config_hash(cfg)
    pruned, crashed = runs["unit-trial-1"], runs["unit-trial-2"]
    assert pruned.data.tags[Tag.SWEEP_TRIAL_STATE] == "PRUNED" and pruned.info.status == "FINISHED"
    assert "pruned by the median pruner at step 2" in pruned.data.tags[Tag.STOP_REASON]
    assert pruned.data.metrics["val_loss"] > runs["unit-trial-0"].data.metrics["val_loss"]  # its last metrics
    assert pruned.data.metrics["val_loss"] == pytest.approx(float(pruned.data.tags[Tag.STOP_REASON].split("=")[1][:-1]),
                                                            rel=1e-4)
    assert crashed.info.status == "FAILED" and crashed.data.tags[Tag.SWEEP_TRIAL_STATE] == "FAIL"
    assert "SimulatedCrash: fake crash" in crashed.data.tags[Tag.FAILURE_REASON]

    parent = client().get_run(summary.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags[Tag.STAGE] == "sweep"
    assert parent.data.params["best.lr"] == "0.003" and parent.data.tags[Tag.SWEEP_BEST_RUN] == runs["unit-trial-0"].info.run_id
    assert parent.data.metrics["best_val_loss"] == pytest.approx(summary.best["value"])
    artifacts = {a.path for folder in ("sweep", "plots") for a in client().list_artifacts(parent.info.run_id, folder)}
    assert {"sweep/trials.csv", "sweep/trials.json", "sweep/best.json", "plots/optimization_history.png",
            "plots/param_importances.png", "plots/parallel_coordinate.png"} <= artifacts
    table = json.loads(Path(client().download_artifacts(parent.info.run_id, "sweep/trials.json")).read_text())
    assert len(table["data"]) == 5 and "mlflow_run_id" in table["columns"]
    assert trainer.smoke_calls == 1
    assert load_config(TINY).train.lr == 1e-3  # the base config file is never modified


def test_failed_smoke_check_refuses_to_start_the_study(mlops_home, tmp_path, snapshot):
    from training.sweep import storage as st

    trainer = FakeTrainer(smoke_fails=True)
    with pytest.raises(MLOpsError, match="base config does not train, so study 'unit' was not started"):
        sweep(tmp_path, snapshot, trainer)
    assert trainer.calls == []
    assert "unit" not in st.study_names(st.open_storage(st.resolve_url()))
    parent = [r for r in client().search_runs([client().get_experiment_by_name("sweep-unit").experiment_id])
              if r.data.tags.get(Tag.STAGE) == "sweep"][0]
    assert parent.info.status == "FAILED" and "smoke run failed" in parent.data.tags[Tag.FAILURE_REASON]


def test_objective_the_trainer_does_not_report_is_refused_before_any_trial(mlops_home, tmp_path, snapshot):
    trainer = FakeTrainer(produce=("loss",))
    with pytest.raises(ConfigError, match="'val_loss' is not produced by the trainer for this base config"):
        sweep(tmp_path, snapshot, trainer)
    assert trainer.calls == []


def test_unreachable_storage_is_refused_before_the_smoke_check(mlops_home, tmp_path, snapshot):
    from training.sweep.storage import StorageError

    trainer = FakeTrainer()
    with pytest.raises(StorageError, match="unreachable"):
        sweep(tmp_path, snapshot, trainer, storage="postgresql://postgres@127.0.0.1:1/nowhere")
    assert trainer.smoke_calls == 0 and client().search_experiments(filter_string="name = 'sweep-unit'") == []


def test_resumed_study_adds_trials_without_a_second_smoke_and_refuses_another_sweep(mlops_home, tmp_path, snapshot):
    trainer, runs = FakeTrainer(), MemoryRuns()
    first = sweep(tmp_path, snapshot, trainer, n_trials=2, pruner="none", runs=runs)
    second = sweep(tmp_path, snapshot, trainer, ["sweep.n_trials=3"], pruner="none", runs=runs)
    assert [o.number for o in first.outcomes] == [0, 1] and [o.number for o in second.outcomes] == [2, 3, 4]
    assert trainer.smoke_calls == 1 and second.best["counts"] == {"COMPLETE": 5}
    assert second.parent_run_id != first.parent_run_id
    with pytest.raises(ConfigError, match="created by a different sweep"):
        sweep(tmp_path, snapshot, trainer, ["sweep.direction=maximize"], pruner="none", runs=runs)


def test_worker_joins_the_study_and_runs_only_queued_trials_under_its_parent(mlops_home, tmp_path, snapshot):
    from training.sweep import runner as rn
    from training.sweep import storage as st
    from training.sweep.session import run_worker

    runs = MemoryRuns()
    first = sweep(tmp_path, snapshot, FakeTrainer(), n_trials=1, pruner="none", runs=runs)
    study = rn.load_study(st.open_storage(st.resolve_url()), "unit")
    rn.enqueue(study, 3)
    worker = FakeTrainer()
    done = run_worker("unit", wait_s=0, max_trials=2, trainer=worker, start_tracker=runs, log=QUIET)
    assert [o.number for o in done.outcomes] == [1, 2] and len(worker.calls) == 2
    rest = run_worker("unit", trainer=worker, start_tracker=runs, log=QUIET)
    assert [o.number for o in rest.outcomes] == [3]
    assert run_worker("unit", trainer=worker, start_tracker=runs, log=QUIET).outcomes == []
    assert {f"unit-trial-{i}" for i in range(4)} <= set(runs.children(first.parent_run_id))
    assert worker.calls[0].run.experiment == "sweep-unit"


def test_worker_for_a_missing_study_names_the_fix(mlops_home):
    from mlops.errors import NotFoundError
    from training.sweep.session import run_worker

    with pytest.raises(NotFoundError, match="there is no study 'nope'.*Fix: start it with `mlops sweep run"):
        run_worker("nope", trainer=FakeTrainer(), log=QUIET)


def _dead_worker_trial(tmp_path, snapshot, **kw):
    """Claim a queued trial the way a worker does, beat once, start its MLflow run, then 'die'."""
    from training.sweep import runner as rn
    from training.sweep import storage as st
    from training.sweep.trial import RUN_ATTR

    sweep(tmp_path, snapshot, FakeTrainer(), n_trials=1, pruner="none", **kw)
    plan_study = rn.load_study(st.open_storage(st.resolve_url()), "unit")
    plan = rn.stored_plan(plan_study)
    store = rn.open_study_storage(st.resolve_url(), plan)
    study = rn.load_study(store, "unit", plan)
    rn.enqueue(study, 1)
    trial, trial_id, _ = rn.claim(study, store)
    run = rn.mlflow_tracker("sweep-unit", "unit-trial-1", {}, rn.study_info(study)["parent_run_id"])
    trial.set_user_attr(RUN_ATTR, run.run_id)
    store.record_heartbeat(trial_id)  # its last beat
    return study, store, trial, run.run_id


def test_trial_of_a_dead_worker_is_failed_by_heartbeat_and_its_run_marked_failed(mlops_home, tmp_path, snapshot):
    import optuna

    from training.sweep.session import study_status

    study, _, trial, run_id = _dead_worker_trial(tmp_path, snapshot)
    assert study_status("unit")["counts"] == {"COMPLETE": 1, "RUNNING": 1}  # within the grace period
    time.sleep(5)  # grace period: 3 x heartbeat_interval (1 s); SQLite times have 1 s resolution
    status = study_status("unit")
    assert status["counts"] == {"COMPLETE": 1, "FAIL": 1}
    assert study.trials[trial.number].state == optuna.trial.TrialState.FAIL
    run = client().get_run(run_id)
    assert run.info.status == "FAILED" and "stopped sending heartbeats" in run.data.tags[Tag.FAILURE_REASON]


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_retry_requeues_a_dead_workers_trial_with_the_same_params(mlops_home, tmp_path, snapshot):
    from training.sweep.session import run_worker

    study, _, trial, _ = _dead_worker_trial(tmp_path, snapshot, retry_failed=1)
    trial.suggest_float("lr", 1e-4, 3e-2, log=True)
    lost = trial.params["lr"]
    time.sleep(5)  # past the grace period (3 s), whole seconds on SQLite
    worker = FakeTrainer()
    done = run_worker("unit", trainer=worker, log=QUIET)
    assert [o.state for o in done.outcomes] == ["COMPLETE"] and done.outcomes[0].params == {"lr": lost}
    assert "trial-0001" in worker.calls[0].train.checkpoint.dir  # resumes the dead trial's checkpoints


def test_nan_validation_loss_fails_the_trial_with_its_reason_and_the_study_goes_on(mlops_home, tmp_path, snapshot):
    params = {"lr": {"key": "train.lr", "type": "float", "low": 1e-4, "high": 3e-2, "log": True},
              "nan": {"key": "train.debug.nan_at_step", "type": "categorical", "choices": [None, 4]}}
    runs = MemoryRuns()
    summary = sweep(tmp_path, snapshot, FakeTrainer(), n_trials=3, pruner="none", params=params, runs=runs,
                    enqueue=[{"lr": 1e-3, "nan": 4}, {"lr": 1e-3, "nan": None}])
    assert [o.state for o in summary.outcomes[:2]] == ["FAIL", "COMPLETE"]
    assert "val_loss is nan at step 4" in summary.outcomes[0].reason
    run = runs.children(summary.parent_run_id)["unit-trial-0"]
    assert run.status == "FAILED" and "diverged" in run.tags[Tag.FAILURE_REASON]
    assert run.tags[Tag.SWEEP_TRIAL_STATE] == "FAIL"


def test_best_command_prints_the_best_trial_with_its_run(mlops_home, tmp_path, snapshot):
    from typer.testing import CliRunner

    from training.sweep_cli import app

    summary = sweep(tmp_path, snapshot, FakeTrainer(), n_trials=3, pruner="none", enqueue=[{"lr": 3e-3}],
                    runs=MemoryRuns())
    result = CliRunner().invoke(app, ["best", "--study", "unit", "--json"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)
    assert best["number"] == 0 and best["mlflow_run_id"] == summary.best["mlflow_run_id"]
    assert best["parent_run_id"] == summary.parent_run_id
    text = CliRunner().invoke(app, ["status", "--study", "unit"]).output
    assert "COMPLETE" in text and summary.best["mlflow_run_id"] in text


def test_float_trial_counts_from_mlflow_are_accepted_and_fractions_refused():
    from training.sweep_cli import _count

    assert _count("8.0", "n-trials") == 8 and _count(None, "n-trials") is None
    with pytest.raises(ConfigError, match="whole number"):
        _count("2.5", "n-trials")


def test_eval_objective_scores_each_trials_model_in_deployment_form(mlops_home, tmp_path, snapshot, monkeypatch):
    import evaluation.runner
    from evaluation.results import Score

    evaluated = []

    def fake_run_eval(cfg, ref, *, suites=None, **kwargs):
        evaluated.append((ref, suites, cfg.run.experiment))
        value = 0.1 * len(evaluated)
        scores = [Score("general_knowledge", "general", "knowledge", "acc", value, 0.01, 20),
                  Score("general_arithmetic", "general", "arithmetic", "exact_match", value / 2, 0.01, 20)]
        return evaluation.runner.EvalOutcome(f"eval-run-{len(evaluated)}", "key", scores, {}, 1.0)

    monkeypatch.setattr(evaluation.runner, "run_eval", fake_run_eval)
    trainer, runs = FakeTrainer(log_model=True), MemoryRuns()
    summary = sweep(tmp_path, snapshot, trainer, n_trials=3, pruner="none", objective="eval/general/score",
                    direction="maximize", runs=runs)
    assert [o.value for o in summary.outcomes] == pytest.approx([0.075, 0.15, 0.225])
    assert [ref for ref, _, _ in evaluated] == [f"runs:/{o.run_id}/model" for o in summary.outcomes]
    assert {tuple(s) for _, s, _ in evaluated} == {("general",)} and evaluated[0][2] == "sweep-unit"
    assert summary.best["number"] == 2
    run = runs.children(summary.parent_run_id)["unit-trial-2"]
    assert run.tags[Tag.EVAL_RUN] == "eval-run-3"
    assert run.metrics[-1][1]["objective/eval/general/score"] == pytest.approx(0.225)


def test_eval_objective_naming_an_unknown_score_is_refused(tmp_path):
    from training.sweep.plan import parse_objective

    with pytest.raises(ConfigError, match="does not report 'acc'"):
        parse_objective("eval/general/acc", "maximize")
    with pytest.raises(ConfigError, match="did you mean 'general'"):
        parse_objective("eval/genral/score", "maximize")
    assert parse_objective("eval/general/knowledge", "maximize").sign == -1.0


def test_asha_prunes_a_trial_behind_its_rung_and_hyperband_runs_the_study(mlops_home, tmp_path, snapshot):
    asha = sweep(tmp_path, snapshot, FakeTrainer(), n_trials=3, pruner={"name": "asha", "min_resource": 2},
                 enqueue=[{"lr": 3e-3}, {"lr": 1e-4}], runs=MemoryRuns())
    assert [o.state for o in asha.outcomes[:2]] == ["COMPLETE", "PRUNED"]
    assert "pruned by the asha pruner at step 2" in asha.outcomes[1].reason
    band = sweep(tmp_path, snapshot, FakeTrainer(), ["sweep.study=band"], n_trials=4, runs=MemoryRuns(),
                 pruner={"name": "hyperband", "min_resource": 2, "reduction_factor": 2})
    assert len(band.outcomes) == 4 and {o.state for o in band.outcomes} <= {"COMPLETE", "PRUNED"}


def test_data_mix_param_builds_each_trials_snapshot_through_the_data_stage(mlops_home, tmp_path, snapshot,
                                                                          monkeypatch):
    import mlops.data.build as build
    from mlops.config import read_yaml

    built = []

    def fake_build(cfg, tracker=None, **kwargs):
        built.append(cfg.data.mix.history.ratio)
        return build.BuildResult(snapshot, Path("/unused"), {}, noop=len(built) > 1)

    monkeypatch.setattr(build, "build_snapshot", fake_build)
    base = read_yaml(TINY)
    base["data"] = {"sources": [{"path": "data/x.jsonl"}], "mix": {"history": {"snapshot": "snap-old", "ratio": 0.3}}}
    path = tmp_path / "base.yaml"
    import yaml

    path.write_text(yaml.safe_dump(base))
    params = {"history_ratio": {"key": "data.mix.history.ratio", "low": 0.1, "high": 0.5}}
    trainer = FakeTrainer()
    from training.sweep.session import run_sweep

    run_sweep(sweep_yaml(tmp_path / "mix.yaml", base=path, params=params, pruner="none", n_trials=2,
                         base_overrides=[f"train.snapshot={snapshot}", "train.max_steps=4", "train.eval_every=2"],
                         enqueue=[{"history_ratio": 0.2}, {"history_ratio": 0.4}]), [], trainer=trainer,
              start_tracker=MemoryRuns(), log=QUIET)
    assert built == [0.2, 0.4]
    assert [c.data.mix.history.ratio for c in trainer.calls] == [0.2, 0.4]
    assert all(c.train.snapshot == snapshot for c in trainer.calls)
