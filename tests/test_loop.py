"""The next round, opened by the data: `mlops loop check` opens a round on the reviewed increment's size, a monitor
alert or the production version's age, as the recorded policy says; builds the next snapshot; launches training
only when the policy says so; logs its decision as an MLflow run; never promotes."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

DAY = 86400.0


def policy(**loop):
    from registry.config import LoopPolicy

    return LoopPolicy(**loop)


def inputs(**fields):
    from evaluation.loop import LoopInputs

    return LoopInputs("support-bot", "inc", **fields)


def test_a_round_opens_for_each_reason_the_policy_names_and_waits_otherwise():
    from evaluation.loop import decide

    rules = policy(min_increment=10, max_age_days=30, on_alert=True)
    assert decide(inputs(accepted=9, production="1", age_days=29.0), rules) == []
    assert [r.split(":")[0] for r in decide(inputs(accepted=10), rules)] == ["increment"]
    assert [r.split(":")[0] for r in decide(inputs(production="1", age_days=31.0), rules)] == ["age"]
    alert = {"version": "1", "signal": "thumbs_down", "reference": "first_week"}
    assert decide(inputs(alerts=[alert]), rules) == ["alert: v1 thumbs_down vs first_week"]
    assert decide(inputs(alerts=[alert]), policy(on_alert=False)) == []


def _fakes():
    built, launched = [], []

    def build(given):
        built.append(given)
        return {"snapshot_id": "snap-next", "data_run_id": "run-data", "records": given.accepted, "history": "h"}

    def launch(given, snapshot):
        launched.append(snapshot["snapshot_id"])
        return {"launched": True, "run_id": "run-train"}

    return built, launched, build, launch


def test_an_open_round_builds_the_snapshot_and_launches_training_only_when_the_policy_says_so():
    from evaluation.loop import check

    built, launched, build, launch = _fakes()
    off = check("support-bot", "inc", policy=policy(min_increment=3), inputs=inputs(accepted=5), build=build,
                launch=launch)
    assert off["decision"] == "open" and off["snapshot"]["snapshot_id"] == "snap-next"
    assert launched == [] and off["training"] == {"launched": False, "why": "registry.loop.launch_training is off"}
    on = check("support-bot", "inc", policy=policy(min_increment=3, launch_training=True), inputs=inputs(accepted=5),
               build=build, launch=launch)
    assert launched == ["snap-next"] and on["training"]["run_id"] == "run-train" and on["promotes"] is False
    quiet = check("support-bot", "inc", policy=policy(min_increment=30), inputs=inputs(accepted=5), build=build,
                  launch=launch)
    assert quiet["decision"] == "wait" and len(built) == 2


def test_a_due_round_with_nothing_accepted_builds_nothing_and_says_what_to_do():
    from evaluation.loop import check

    built, launched, build, launch = _fakes()
    due = check("support-bot", "data/harvest/next", policy=policy(max_age_days=10, launch_training=True),
                inputs=inputs(production="1", age_days=40.0), build=build, launch=launch)
    assert due["decision"] == "due" and built == [] and launched == []
    assert "holds no accepted record" in due["notes"][0] and "mlops data harvest" in due["notes"][0]


def test_the_increment_counts_accepted_rows_that_carry_a_correction(tmp_path):
    from evaluation.loop import count_increment

    assert count_increment(tmp_path)[0] == 0 and "no harvested increment" in count_increment(tmp_path)[2]
    rows = [{"request_id": "a", "accepted": True, "correction": "right"},
            {"request_id": "b", "accepted": True, "correction": " "},
            {"request_id": "c", "accepted": False, "correction": "x"},
            {"request_id": "d", "accepted": None, "correction": None}]
    (tmp_path / "increment.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert count_increment(tmp_path) == (1, 1, None)


def test_a_dpo_round_opens_on_accepted_pairs_and_auto_picks_dpo_only_once_enough_are_accepted():
    from evaluation.loop import check, decide, round_objective

    dpo, auto = policy(mode="dpo", min_pairs=4, min_increment=2), policy(mode="auto", min_pairs=4, min_increment=2)
    assert [r.split(":")[0] for r in decide(inputs(pairs=4, accepted=9), dpo)] == ["pairs"]  # corrections: not dpo's
    assert decide(inputs(pairs=3), dpo) == []
    assert round_objective(inputs(pairs=4, accepted=9), auto) == "dpo"
    assert round_objective(inputs(pairs=3, accepted=9), auto) == "sft"
    built, launched, build, launch = _fakes()
    out = check("support-bot", "inc", policy=policy(mode="auto", min_pairs=4, launch_training=True),
                inputs=inputs(pairs=6), build=build, launch=launch)
    assert out["decision"] == "open" and out["objective"] == "dpo" and built[0].objective == "dpo"


def test_a_due_dpo_round_without_accepted_pairs_says_how_to_harvest_them():
    from evaluation.loop import check

    built, launched, build, launch = _fakes()
    due = check("support-bot", "inc", policy=policy(mode="dpo", max_age_days=10),
                inputs=inputs(production="1", age_days=40.0, accepted=50), build=build, launch=launch)
    assert due["decision"] == "due" and due["objective"] == "dpo" and built == []
    assert "mlops data harvest --pairs" in due["notes"][0]


def test_the_launcher_trains_a_dpo_round_with_the_dpo_objective_from_production(monkeypatch, tmp_path):
    import mlflow.projects

    from evaluation.loop import mlflow_project_launcher
    from mlops import run_store

    seen = {}

    class Submitted:
        run_id = "run-dpo"

    def fake_run(uri, **kwargs):
        seen.update(kwargs)
        return Submitted()

    monkeypatch.setattr(mlflow.projects, "run", fake_run)
    monkeypatch.setattr(run_store, "latest_run", lambda tags: None)
    launch = mlflow_project_launcher("configs/train/tiny.yaml", project=tmp_path, experiment="e")
    out = launch(inputs(production="3", objective="dpo"), {"snapshot_id": "snap-pairs"})
    overrides = seen["parameters"]["overrides"].split()
    assert out["launched"] and "train.objective=dpo" in overrides
    assert "base_model=models:/support-bot/3" in overrides and "train.snapshot=snap-pairs" in overrides


def test_the_increment_counts_accepted_pairs_beside_its_records(tmp_path):
    from evaluation.loop import count_pairs

    assert count_pairs(tmp_path) == (0, 0)
    rows = [{"pair_id": "p1", "accepted": True}, {"pair_id": "p2", "accepted": None},
            {"pair_id": "p3", "accepted": False}, {"pair_id": "p4", "accepted": True}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert count_pairs(tmp_path) == (2, 1)


@pytest.mark.parametrize(("field", "value"), [("min_increment", 0), ("max_age_days", -1), ("history_ratio", 1.0),
                                               ("launch_training", "maybe"), ("mode", "rlhf"), ("min_pairs", 0)])
def test_a_loop_policy_out_of_range_names_the_field_the_value_and_the_fix(tmp_path, field, value):
    from mlops.errors import ConfigError
    from registry.config import read_policy_file

    path = tmp_path / "release.yaml"
    path.write_text(yaml.safe_dump({"registry": {"loop": {field: value}}}))
    with pytest.raises(ConfigError) as err:
        read_policy_file(path)
    assert f"registry.loop.{field}" in str(err.value) and str(value) in str(err.value) and "Fix:" in str(err.value)


def test_the_trigger_never_reaches_a_registry_act():
    acts = {"registry.transition", "registry.release", "registry.canary", "registry.identities"}
    for name in ("loop.py", "loop_cli.py"):
        tree = ast.parse((REPO / "evaluation" / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & acts, name


# --------------------------------------------------------------------------- gather and the CLI


def _ledger_state(snapshot: str, promoted_days_ago: float):
    from registry.entries import Entry
    from registry.resolve import state_in

    def iso(days_ago):
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - days_ago * DAY))

    entries = [Entry(1, iso(promoted_days_ago + 1), "ada", "register", "support-bot", "1", None, "candidate",
                     evidence={"snapshot_id": snapshot}),
               Entry(2, iso(promoted_days_ago), "grace", "promote", "support-bot", "1", "candidate", "production",
                     "production", None, "1")]
    return state_in("support-bot", entries)


@pytest.fixture
def governed(mlops_home, monkeypatch):
    """A ledger view without a ledger: v1 in production for 40 days, trained on `snap-history`; the policy opens a
    round at 2 accepted records; the monitor raises one alert."""
    import evaluation.monitor_cli as monitor_cli
    import registry.resolve as resolve
    from registry.config import LoopPolicy, RegistryConfig

    held = {"policy": RegistryConfig(loop=LoopPolicy(min_increment=2, max_age_days=90))}
    monkeypatch.setattr(resolve, "release_policy", lambda url=None: held["policy"])
    monkeypatch.setattr(resolve, "require_model", lambda model, url=None: _ledger_state("snap-history", 40))
    alert = {"version": "1", "signal": "refusal", "reference": "first_week"}
    monkeypatch.setattr(monitor_cli, "monitor_model", lambda model, days, now=None: {"alerts": [alert]})
    return held


def _increment(folder: Path, records: list[dict], accepted: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"request_id": f"req-{i}", "messages": [m for m in r["messages"] if m["role"] != "assistant"],
             "answer": "Sorry, I cannot help with that.", "correction": r["messages"][-1]["content"],
             "feedback_ids": [f"fb-{i}"], "accepted": True if i < accepted else None, "note": ""}
            for i, r in enumerate(records)]
    (folder / "increment.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_loop_check_logs_its_decision_and_inputs(governed, tmp_path, monkeypatch):
    from contextlib import nullcontext

    import evaluation.loop as loop
    from evaluation.loop_cli import run_check
    from mlops.data.sample import Gen
    from mlops.tracking import MemoryTracker

    built = []
    monkeypatch.setattr(loop, "snapshot_builder", lambda config, ratio: lambda i: built.append((i, ratio)) or {
        "snapshot_id": "snap-next", "data_run_id": "run-data", "records": i.accepted, "history": i.history_snapshot})
    gen = Gen(1)
    folder = _increment(tmp_path / "next", [gen.support() for _ in range(3)], accepted=2)
    tracker = MemoryTracker()
    result = run_check("support-bot", folder, config=None, train_config=None, experiment="loop",
                       run=nullcontext(tracker))
    assert result["decision"] == "open" and [r.split(":")[0] for r in result["reasons"]] == ["increment", "alert"]
    (given, ratio), = built
    assert given.history_snapshot == "snap-history" and given.production == "1" and ratio == 0.3
    assert 39.9 < given.age_days < 40.1
    assert tracker.params["decision"] == "open" and tracker.params["policy.min_increment"] == "2"
    assert tracker.metrics[-1][1]["accepted_records"] == 2 and tracker.metrics[-1][1]["monitor_alerts"] == 1
    assert tracker.tags["mlops.data_snapshot_id"] == "snap-next" and tracker.tags["mlops.loop.decision"] == "open"
    assert tracker.artifacts["loop_decision.json"]["inputs"]["accepted"] == 2


def test_a_policy_that_launches_training_without_a_training_config_is_refused_before_anything_runs(governed,
                                                                                                   tmp_path):
    from evaluation.loop_cli import run_check
    from mlops.errors import MLOpsError
    from registry.config import LoopPolicy, RegistryConfig

    governed["policy"] = RegistryConfig(loop=LoopPolicy(launch_training=True))
    with pytest.raises(MLOpsError, match=r"launch_training: true.*Fix: pass --train-config"):
        run_check("support-bot", tmp_path, config=None, train_config=None, experiment="loop")


@pytest.mark.slow
def test_loop_check_builds_the_next_snapshot_mixed_with_and_deduplicated_against_production(governed, tiny_model,
                                                                                          tmp_path, monkeypatch):
    """End to end on the real build: the production version's snapshot is the history; a correction already in it
    is dropped as a duplicate; a rerun reuses the snapshot; the fake launcher gets it."""
    from evaluation.loop_cli import run_check
    from mlops.config import load_config
    from mlops.data.sample import Gen
    from mlops.data.testing import quick_build

    gen = Gen(1)
    history_records = [gen.support() for _ in range(40)]
    history = quick_build(history_records, base_model=tiny_model["path"], workdir=tmp_path, name="old.jsonl")
    from registry.config import LoopPolicy, RegistryConfig

    governed["policy"] = RegistryConfig(loop=LoopPolicy(min_increment=5, launch_training=True))
    import registry.resolve as resolve

    monkeypatch.setattr(resolve, "require_model", lambda model, url=None: _ledger_state(history.snapshot_id, 3))
    gen2 = Gen(2)
    folder = _increment(tmp_path / "next", [gen2.support() for _ in range(16)] + history_records[:1], accepted=17)
    config = tmp_path / "data.yaml"
    config.write_text(yaml.safe_dump({"base_model": str(tiny_model["path"]), "run": {"experiment": "loop"},
                                      "data": {"sources": [{"path": "replaced.jsonl"}], "batch_size": 16,
                                               "seq_len": 256, "workers": 1, "validation_fraction": 0.1}}))
    launched = []
    result = run_check("support-bot", folder, config=load_config(config, []), train_config="configs/train/tiny.yaml",
                       experiment="loop", launch=lambda i, s: launched.append(s["snapshot_id"]) or {"launched": True,
                                                                                                   "run_id": "fake"})
    snapshot = result["snapshot"]
    assert result["decision"] == "open" and snapshot["history"] == history.snapshot_id and snapshot["records"] == 17
    from mlops.data.snapshot import list_snapshots

    manifest = next(m for m in list_snapshots() if m["snapshot_id"] == snapshot["snapshot_id"])
    assert manifest["mixing"]["history"]["snapshot"] == history.snapshot_id
    assert manifest["counters"]["dedup.exact_of_snapshot"] == 1
    assert launched == [snapshot["snapshot_id"]]
    from mlops.run_store import get_run

    run = get_run(result["run_id"])  # the decision as an MLflow run
    assert run.info.status == "FINISHED" and run.data.tags["mlops.stage"] == "loop"
    assert run.data.params["decision"] == "open" and run.data.tags["mlops.data_snapshot_id"] == snapshot["snapshot_id"]
    again = run_check("support-bot", folder, config=load_config(config, []), train_config="configs/train/tiny.yaml",
                      experiment="loop", launch=lambda i, s: {"launched": False, "why": "test"})
    assert again["snapshot"]["snapshot_id"] == snapshot["snapshot_id"]


@pytest.mark.slow
def test_loop_check_on_a_real_ledger_reads_production_and_waits_under_the_recorded_policy(app_store, tmp_path):
    """The real readers: the seeded store's verified ledger (bot v-production, its snapshot, its age), its recorded
    policy (defaults: a round opens at 200 accepted records), the monitor on a request log without traffic."""
    from typer.testing import CliRunner

    from mlops.cli import _register_stages, app
    from mlops.data.sample import Gen
    from mlops.run_store import find_runs

    gen = Gen(1)
    folder = _increment(tmp_path / "next", [gen.support() for _ in range(3)], accepted=3)
    config = tmp_path / "data.yaml"
    config.write_text(yaml.safe_dump({"base_model": "tiny", "data": {"sources": [{"path": "x.jsonl"}]}}))
    _register_stages()
    done = CliRunner().invoke(app, ["loop", "check", "bot", "--increment", str(folder), "--config", str(config),
                                    "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert result["decision"] == "wait" and result["inputs"]["accepted"] == 3
    assert result["inputs"]["production"] and result["inputs"]["history_snapshot"]
    assert 0 <= result["inputs"]["age_days"] < 30
    assert any(n.startswith("monitor: no served traffic of 'bot'") for n in result["inputs"]["notes"])
    run = find_runs({"mlops.stage": "loop"}, max_results=1)[0]
    assert run.info.run_id == result["run_id"] and run.data.params["decision"] == "wait"


def test_the_launcher_runs_the_train_entry_point_on_the_new_snapshot_once(monkeypatch, tmp_path):
    import mlflow.projects

    import mlops.run_store as run_store
    from evaluation.loop import mlflow_project_launcher

    calls, trained = [], {}
    monkeypatch.setattr(mlflow.projects, "run", lambda uri, **kw: calls.append((uri, kw)) or type(
        "Submitted", (), {"run_id": "run-train-1"})())
    monkeypatch.setattr(run_store, "latest_run", lambda tags, **_: trained.get(tags["mlops.data_snapshot_id"]))
    launch = mlflow_project_launcher("configs/train/tiny.yaml", project=tmp_path / "mlproject", experiment="loop")
    first = launch(inputs(production="4"), {"snapshot_id": "snap-next"})
    assert first == {"launched": True, "run_id": "run-train-1", "entry_point": "train",
                     "config": "configs/train/tiny.yaml",
                     "overrides": ["train.snapshot=snap-next", "base_model=models:/support-bot/4"]}
    (uri, kw), = calls
    assert uri == str(tmp_path / "mlproject") and kw["entry_point"] == "train" and kw["synchronous"] is False
    assert kw["parameters"] == {"config": "configs/train/tiny.yaml",
                                "overrides": "train.snapshot=snap-next base_model=models:/support-bot/4"}
    trained["snap-next"] = "run-train-1"
    again = launch(inputs(production="4"), {"snapshot_id": "snap-next"})
    assert again["launched"] is False and len(calls) == 1 and "already trained" in again["why"]


@pytest.mark.slow
def test_mlops_loop_check_opens_round_3_like_the_demo(mlops_home, tiny_model, tmp_path):
    """The demo's step 11 in miniature, through the real CLI in its own process: a recorded policy that opens a
    round at 2 accepted records, production v1 trained on a real snapshot, a reviewed increment; the command
    builds the next snapshot with v1's snapshot as history and leaves the registry as it was."""
    import os
    import subprocess
    import sys

    from mlops.data.sample import Gen
    from mlops.data.testing import quick_build
    from mlops.tracking import MlflowTracker, init_experiment
    from registry.audit import model_state
    from registry.release import register
    from registry.testing import data_run, make_identities, release_version, training_run

    history_records = [Gen(1).support() for _ in range(40)]
    history = quick_build(history_records, base_model=tiny_model["path"], workdir=tmp_path, name="old.jsonl")
    (mlops_home / "configs" / "registry").mkdir(parents=True)
    (mlops_home / "configs" / "registry" / "release.yaml").write_text("registry:\n  loop: {min_increment: 2}\n")
    init_experiment("registry-test")
    who = make_identities()
    built_by = data_run("registry-test", history.snapshot_id)
    run_id = training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=1, data_run_id=built_by)
    MlflowTracker.existing(run_id).set_tags({"mlops.data_snapshot_id": history.snapshot_id})
    register(who["tina"], run_id, "bot")
    release_version(who, "bot", "1")
    before = model_state("bot")
    folder = _increment(tmp_path / "round3", [Gen(2).support() for _ in range(4)], accepted=3)
    config = tmp_path / "data.yaml"
    config.write_text(yaml.safe_dump({"base_model": str(tiny_model["path"]), "run": {"experiment": "loop"},
                                      "data": {"sources": [{"path": "replaced.jsonl"}], "batch_size": 16,
                                               "seq_len": 256, "workers": 1, "validation_fraction": 0.1,
                                               "min_records": 1}}))
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    done = subprocess.run(["mlops", "loop", "check", "bot", "--increment", str(folder), "--config", str(config),
                           "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    result = json.loads(done.stdout)
    assert result["decision"] == "open" and result["inputs"]["history_snapshot"] == history.snapshot_id
    assert result["snapshot"]["records"] == 3 and result["snapshot"]["history"] == history.snapshot_id
    after = model_state("bot")
    assert after.aliases == before.aliases and after.last_seq == before.last_seq  # nothing promoted, nothing ledgered
