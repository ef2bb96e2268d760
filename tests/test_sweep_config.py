"""Sweep config: search spaces, bad input refused before any trial, storage URLs, plans stored with the study."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlops.errors import ConfigError
from training.sweep.plan import SweepPlan, build_plan, parse_objective
from training.sweep.spaces import SPACES, apply_values, resolve_space
from training.sweep.storage import StorageError, check_reachable, display_url, normalize_url, resolve_url
from training.sweep.testing import sweep_yaml

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "train" / "tiny.yaml"


def plan_for(tmp_path: Path, overrides: list[str] = (), **sweep) -> SweepPlan:
    path = sweep_yaml(tmp_path / "sweep.yaml", base=TINY, base_overrides=["train.snapshot=snap-x"], **sweep)
    return build_plan(path, list(overrides))


def refused(tmp_path: Path, overrides: list[str], **sweep) -> str:
    with pytest.raises(ConfigError) as err:
        plan_for(tmp_path, overrides, **sweep)
    return str(err.value)


def test_registered_space_gives_defaults_and_params_override_it_field_by_field(tmp_path):
    plan = plan_for(tmp_path, space="lora", params={"lr": {"high": 5e-4}, "lora_alpha": {"enabled": False}})
    lr = plan.params["lr"]
    assert (lr.key, lr.low, lr.high, lr.log) == ("train.lr", 1e-5, 5e-4, True)
    assert "lora_alpha" not in plan.params
    assert {"lora_r", "warmup_ratio", "micro_batch_size", "grad_accum"} <= set(plan.params)
    assert set(SPACES.names()) >= {"lora", "lr", "full", "lora-mix"}


def test_param_without_key_maps_to_the_train_key_of_its_name(tmp_path):
    spaces = resolve_space("", {"weight_decay": SPACES.get("full")["weight_decay"].model_copy(update={"key": None})})
    assert spaces["weight_decay"].key == "train.weight_decay"


def test_low_above_high_is_refused_naming_param_value_and_fix(tmp_path):
    message = refused(tmp_path, ["sweep.params.lr.low=0.1", "sweep.params.lr.high=0.01"])
    assert "sweep.params.lr" in message and "low=0.1 > high=0.01" in message and "Fix:" in message


def test_log_scale_with_a_non_positive_bound_is_refused(tmp_path):
    message = refused(tmp_path, ["sweep.params.lr.low=0"])
    assert "sweep.params.lr" in message and "log scale" in message and "low=0" in message and "Fix:" in message


def test_empty_search_space_is_refused(tmp_path):
    assert "search space is empty" in refused(tmp_path, [], params={})


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("sweep.space=lroa", "did you mean 'lora'?"),
        ("sweep.pruner=medain", "did you mean 'median'?"),
        ("sweep.sampler=tpee", "did you mean 'tpe'?"),
        ("sweep.objective=val_los", "did you mean 'val_loss'?"),
    ],
)
def test_unknown_names_are_refused_with_the_closest_one(tmp_path, override, expected):
    message = refused(tmp_path, [override])
    assert expected in message and "Fix:" in message


def test_objective_the_trainer_does_not_produce_is_refused(tmp_path):
    message = refused(tmp_path, ["sweep.objective=accuracy"])
    assert "'accuracy' is not a metric the trainer produces" in message and "val_loss" in message


def test_bound_that_makes_an_invalid_train_config_is_refused(tmp_path):
    params = {"batch": {"key": "train.micro_batch_size", "type": "int", "low": 0, "high": 4}}
    message = refused(tmp_path, [], params=params)
    assert "sweep.params.batch (train.micro_batch_size) at its low bound = 0" in message
    assert "greater than or equal to 1" in message


def test_unknown_config_key_is_refused_with_did_you_mean(tmp_path):
    message = refused(tmp_path, [], params={"x": {"key": "train.lrr", "low": 1e-4, "high": 1e-3}})
    assert "unknown key 'train.lrr'" in message and "did you mean 'lr'?" in message


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"type": "categorical"}, "has no choices"),
        ({"type": "categorical", "choices": [1, 2], "low": 1}, "do not apply"),
        ({"type": "int", "low": 1.5, "high": 4}, "whole numbers"),
        ({"type": "float", "low": 1e-4, "high": 1e-2, "log": True, "step": 1e-4}, "both log and step"),
        ({"type": "float", "low": 1e-4}, "needs both low and high"),
    ],
)
def test_malformed_params_are_refused(tmp_path, spec, expected):
    assert expected in refused(tmp_path, [], params={"lr": {"key": "train.lr", **spec}})


def test_searching_the_sweeps_own_settings_is_refused(tmp_path):
    message = refused(tmp_path, [], params={"exp": {"key": "run.experiment", "type": "categorical", "choices": ["a"]}})
    assert "which the sweep itself decides" in message


def test_data_mix_param_needs_a_base_with_a_data_section(tmp_path):
    message = refused(tmp_path, [], params={"mix": {"key": "data.mix.history.ratio", "low": 0.1, "high": 0.5}})
    assert "has no `data:` section" in message


def test_warmup_ratio_becomes_steps_of_max_steps(tmp_path):
    plan = plan_for(tmp_path, ["train.max_steps=40"], params={
        "warmup_ratio": {"key": "train.warmup_steps", "low": 0.0, "high": 0.5, "of": "train.max_steps"}})
    data = apply_values(plan.params, {"warmup_ratio": 0.25}, plan.base)
    assert data["train"]["warmup_steps"] == 10 and plan.base["train"]["warmup_steps"] == 2


def test_overrides_split_between_sweep_settings_and_the_base_of_every_trial(tmp_path):
    plan = plan_for(tmp_path, ["sweep.n_trials=3", "train.max_steps=20", "run.seed=9"])
    assert plan.sweep.n_trials == 3 and plan.seed == 9
    assert plan.base["train"]["max_steps"] == 20 and plan.base["run"]["seed"] == 9
    assert plan.budget.max_steps == 20


def test_enqueued_trials_must_lie_inside_the_space(tmp_path):
    assert "outside [0.0001, 0.03]" in refused(tmp_path, [], enqueue=[{"lr": 0.5}])
    assert "not a searched parameter" in refused(tmp_path, [], enqueue=[{"lrr": 1e-3}])


def test_hyperband_rungs_default_to_eval_every_and_max_steps_and_must_fit(tmp_path):
    plan = plan_for(tmp_path, ["sweep.pruner=hyperband", "train.eval_every=4", "train.max_steps=36"])
    pruner = plan.pruner()
    assert type(pruner).__name__ == "HyperbandPruner"
    assert (pruner._min_resource, pruner._max_resource) == (4, 36)
    assert "min_resource=50 is above" in refused(tmp_path, ["sweep.pruner.name=asha", "sweep.pruner.min_resource=50"])


def test_plan_round_trips_through_the_study_attributes(tmp_path):
    plan = plan_for(tmp_path, space="lora", params={"lr": {"high": 5e-4}})
    again = SweepPlan.from_attrs(plan.to_attrs())
    assert again.plan_hash == plan.plan_hash and again.params == plan.params and again.base == plan.base
    changed = plan_for(tmp_path, ["sweep.direction=maximize"], space="lora", params={"lr": {"high": 5e-4}})
    assert changed.plan_hash != plan.plan_hash
    volatile = plan_for(tmp_path, ["sweep.n_trials=99", "sweep.heartbeat_interval=3"], space="lora",
                        params={"lr": {"high": 5e-4}})
    assert volatile.plan_hash == plan.plan_hash


def test_eval_objective_prunes_on_validation_loss_in_the_objectives_direction():
    obj = parse_objective("val_perplexity", "minimize")
    assert (obj.intermediate, obj.sign, obj.source) == ("val_perplexity", 1.0, "trainer")
    assert parse_objective("loss_last", "minimize").intermediate == "val_loss"


def test_postgres_urls_get_the_installed_driver_and_passwords_stay_hidden(tmp_path, monkeypatch):
    assert normalize_url("postgresql://u:pw@db:5432/s") == "postgresql+psycopg://u:pw@db:5432/s"
    assert normalize_url("postgres://u@db/s") == "postgresql+psycopg://u@db/s"
    assert normalize_url(str(tmp_path / "s.db")) == f"sqlite:///{tmp_path / 's.db'}"
    assert display_url("postgresql+psycopg://u:pw@db:5432/s") == "postgresql+psycopg://u:***@db:5432/s"
    monkeypatch.setenv("MLOPS_HOME", str(tmp_path))
    monkeypatch.delenv("MLOPS_SWEEP_STORAGE", raising=False)
    assert resolve_url() == f"sqlite:///{tmp_path / '.mlops' / 'optuna.db'}"
    monkeypatch.setenv("MLOPS_SWEEP_STORAGE", "postgresql://x@h/db")
    assert resolve_url() == "postgresql+psycopg://x@h/db"
    assert resolve_url("sqlite:////a.db", "postgresql://y@h/db") == "sqlite:////a.db"


def test_unreachable_storage_is_a_clear_error(tmp_path):
    with pytest.raises(StorageError) as err:
        check_reachable("postgresql+psycopg://postgres@127.0.0.1:1/nowhere", timeout=2)
    assert "unreachable" in str(err.value) and "Fix:" in str(err.value)
    with pytest.raises(StorageError, match="unsupported scheme"):
        check_reachable("redis://localhost/0")


def test_opening_storage_retries_when_another_worker_is_creating_the_schema(monkeypatch):
    import optuna
    from psycopg.errors import UniqueViolation

    from training.sweep import storage as st

    calls = []

    def flaky(url, **kwargs):
        calls.append(url)
        if len(calls) < 3:
            raise UniqueViolation('duplicate key value violates unique constraint "pg_type_typname_nsp_index"')
        return "storage"

    monkeypatch.setattr(optuna.storages, "RDBStorage", flaky)
    monkeypatch.setattr(st.time, "sleep", lambda s: None)
    assert st.open_storage("postgresql+psycopg://u@h/db") == "storage" and len(calls) == 3

    def broken(url, **kwargs):
        raise RuntimeError("password authentication failed")

    monkeypatch.setattr(optuna.storages, "RDBStorage", broken)
    with pytest.raises(StorageError, match="password authentication failed"):
        st.open_storage("postgresql+psycopg://u@h/db")


@pytest.mark.postgres
def test_workers_opening_one_empty_postgres_database_together_all_succeed(postgres_url):
    import subprocess
    import sys
    import time

    script = ("import sys, time; from training.sweep.storage import open_storage\n"
              "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
              "open_storage(sys.argv[1]); print('ok')")
    start = str(time.time() + 4)  # all four create the schema at the same moment
    procs = [subprocess.Popen([sys.executable, "-c", script, postgres_url, start], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(4)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 and out.strip().endswith("ok") for p, out in zip(procs, outs, strict=True)), outs
