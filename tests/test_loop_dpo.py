"""One whole DPO round on the tiny model: production v1 serves, people correct answers and judge a spot-check,
`mlops data harvest --pairs` turns both into pairs, a reviewer accepts them, `mlops loop check` (policy mode dpo)
builds the preference snapshot, DPO trains from v1's weights, both versions are scored on the held-out pairs
through the served gateway, and the gate judges the candidate against v1 on them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_harvest_pairs import SINCE, feedback, log, spotcheck_export, support

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a training, two served evals and three builds: CI runs it
def test_one_dpo_round_from_served_answers_to_the_pairwise_gate(mlops_home, tiny_model, tmp_path):
    from evaluation.config import GateConfig
    from evaluation.gate import compare
    from evaluation.loop_cli import run_check
    from evaluation.pairs import TASK, write_pair_suite
    from evaluation.runner import run_eval
    from mlops.config import load_config
    from mlops.data.harvest_pairs import harvest_pairs, read_pairs, review_pair
    from mlops.data.testing import quick_build
    from mlops.tracking import MlflowTracker, init_experiment
    from registry.audit import model_state
    from registry.release import register
    from registry.testing import data_run, make_identities, release_version, training_run

    # Production v1, under a policy whose rounds are DPO rounds.
    history = quick_build(support(30, seed=1), base_model=tiny_model["path"], workdir=tmp_path, name="old.jsonl")
    (mlops_home / "configs" / "registry").mkdir(parents=True)
    (mlops_home / "configs" / "registry" / "release.yaml").write_text(
        "registry:\n  loop: {mode: dpo, min_pairs: 4}\n")
    init_experiment("registry-test")
    who = make_identities()
    run_id = training_run(Path(tiny_model["path"]), tmp=tmp_path, variant=1,
                          data_run_id=data_run("registry-test", history.snapshot_id))
    MlflowTracker.existing(run_id).set_tags({"mlops.data_snapshot_id": history.snapshot_id})
    register(who["tina"], run_id, "bot")
    release_version(who, "bot", "1")
    before = model_state("bot")

    # Served answers, corrections and a spot-check, then the pairs a reviewer accepts.
    records = support(14, seed=5)
    served = log(records, prefix="live")
    for i in range(8, 14):
        feedback(served[i], -1, correction=records[i]["messages"][-1]["content"])
    spot = spotcheck_export(tmp_path / "spotcheck.jsonl", records)
    increment = tmp_path / "round"
    harvested = harvest_pairs(SINCE, increment, model="bot", spotchecks=[spot])
    assert harvested["by_kind"].get("correction") == 6 and harvested["by_kind"].get("spotcheck") == 2
    for _, row in read_pairs(increment):
        review_pair(increment, row["pair_id"], True)

    # The loop opens a DPO round and builds the preference snapshot.
    data_yaml = tmp_path / "data.yaml"
    data_yaml.write_text(yaml.safe_dump({"base_model": str(tiny_model["path"]), "run": {"experiment": "loop"},
                                         "data": {"sources": [{"path": "replaced.jsonl"}], "batch_size": 16,
                                                  "seq_len": 256, "workers": 1, "validation_fraction": 0.3,
                                                  "min_records": 1, "accept": {"on_fail": "flag"},
                                                  "decontam": {"eval_sets": []}}}))
    decision = run_check("bot", increment, config=load_config(data_yaml), train_config=None, experiment="loop")
    assert decision["decision"] == "open" and decision["objective"] == "dpo"
    assert decision["reasons"][0].startswith("pairs: 8 accepted")
    snapshot = decision["snapshot"]["snapshot_id"]
    assert decision["snapshot"]["record_type"] == "preference"

    # DPO from the production version's weights, as the launched `mlflow run -e train` would.
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    trained = subprocess.run(
        [sys.executable, "-m", "mlops", "train", "run", "--config", str(REPO / "configs/train/tiny.yaml"),
         "train.objective=dpo", "train.mode=lora", "base_model=models:/bot/1", f"train.snapshot={snapshot}",
         "train.max_steps=8", "train.lr=5e-3", "train.progress=false", f"train.checkpoint.dir={tmp_path / 'ckpt'}"],
        env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-4000:]
    candidate_run = re.search(r"^run ([0-9a-f]{32}): FINISHED", trained.stdout, re.M).group(1)

    # Pairwise evaluation of both versions on the held-out pairs, in deployment form, then the gate.
    suites = tmp_path / "suites"
    write_pair_suite(snapshot, suites, tokenizer_path=tiny_model["path"])
    cfg = load_config(None, ["eval.concurrency=2", "run.experiment=eval-test", "eval.contamination.enabled=false",
                             f"eval.suite_paths=[{suites}]"])
    candidate = run_eval(cfg, f"runs:/{candidate_run}/model", suites="pairs")
    champion = run_eval(cfg, "models:/bot/1", suites="pairs")
    held_out = [t for t in candidate.summary["tasks"] if t["name"] == TASK]
    assert held_out and held_out[0]["n"] >= 2 and 0.0 <= held_out[0]["value"] <= 1.0
    report = compare(candidate.summary, champion.summary, GateConfig(must_improve=[TASK]))
    judged = [c for c in report.checks if c.name == TASK and c.rule == "must_improve"]
    assert judged, json.dumps([c.name for c in report.checks])
    # On a handful of held-out pairs a tiny model cannot win beyond the interval: the gate says so, by name.
    assert judged[0].passed == (judged[0].lo > 0)
    assert report.passed or any(TASK in reason for reason in report.reasons)

    after = model_state("bot")
    assert after.aliases == before.aliases  # the round never promotes: the gate's verdict goes to people
