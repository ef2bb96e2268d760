"""The whole release loop of `make demo`, on the tiny model: two rounds, a server following the registry, a
refused broken candidate, a rollback and the harvest. Asserts on the stored state (registry, ledger, runs,
request log), never on printed text; then a rerun changes nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow
LINKED = ("mlproject", "evaluation", "scripts")  # what the demo reads from the project (and configs/, below)


def _demo(home: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "scripts/demo.py", *(args or ("--profile", "tiny"))], cwd=home, env=env,
                          capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    home = tmp_path_factory.mktemp("demo-home")
    for name in LINKED:
        (home / name).symlink_to(REPO / name)
    (home / "configs").mkdir()
    for child in (REPO / "configs").iterdir():
        if child.name != "registry":
            (home / "configs" / child.name).symlink_to(child)
    (home / "configs" / "registry").mkdir()
    # The policy bootstrap records, as `make demo-quick`'s: the tiny model is random, no share of its answers is
    # "acceptable".
    (home / "configs" / "registry" / "release.yaml").write_bytes((REPO / "scripts/demo_tiny_release.yaml").read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "MASTER_", "RANK", "WORLD_SIZE",
                                                                    "LOCAL_RANK", "MLOPS_"))}
    env.update(MLOPS_HOME=str(home), MLOPS_LEDGER_KEY_DIR=str(home / "ledger-keys"),
               MLFLOW_TRACKING_URI=f"sqlite:///{home / '.mlops' / 'mlflow.db'}",
               PATH=str(Path(sys.executable).parent) + os.pathsep + env["PATH"])
    # `make demo-quick` first: one round, which the full demo then finds done and goes on from.
    quick = _demo(home, env, "--quick")
    first = _demo(home, env)
    return {"home": home, "env": env, "quick": quick, "first": first}


@pytest.fixture
def stored(loop, monkeypatch):
    import mlflow

    for key in ("MLOPS_HOME", "MLFLOW_TRACKING_URI", "MLOPS_LEDGER_KEY_DIR"):
        monkeypatch.setenv(key, loop["env"][key])
    mlflow.set_tracking_uri(None)
    from registry.report import release_report

    return release_report("support-bot")


def test_the_loop_ends_with_v1_in_production_after_v2_was_promoted_and_rolled_back(stored):
    assert stored["aliases"] == {"production": "1"}
    stages = {v["version"]: v["stage"] for v in stored["versions"]}
    assert stages == {"1": "production", "2": "rolled_back", "3": "candidate"}
    promotions = [(e["version"], e["alias_before"], e["alias_after"]) for e in stored["ledger"]
                  if e["action"] in ("promote", "rollback") and e["alias"] == "production"]
    assert promotions == [("1", None, "1"), ("2", "1", "2"), ("1", "2", "1")]
    assert stored["ledger_verified"]


def test_ledger_holds_each_act_in_order_by_the_right_identity(stored):
    acts = [(e["action"], e["version"], e["actor"]) for e in stored["ledger"]
            if e["action"] in ("register", "approve", "promote", "rollback")]
    assert acts[:4] == [("register", "1", "ada"), ("approve", "1", "grace"), ("promote", "1", "grace"),
                        ("register", "2", "ada")]
    assert ("approve", "2", "grace") in acts and ("register", "3", "ada") in acts
    assert acts[-1] == ("rollback", "1", "grace")
    reviews = [e for e in stored["ledger"] if e["action"] == "spot_check_review"]
    assert {e["version"] for e in reviews} == {"1", "2"} and all(e["actor"] == "grace" for e in reviews)
    assert [e["version"] for e in stored["ledger"] if e["action"] == "approve"] == ["1", "2"]  # never v3


def test_the_broken_candidate_is_refused_for_its_leaked_eval_data_and_stays_a_candidate(stored):
    v3 = next(v for v in stored["versions"] if v["version"] == "3")
    blocking = {b["gate"]: b["detail"] for b in v3["blocking"]}
    assert "contamination" in blocking and "overlap the training snapshot" in blocking["contamination"]
    assert v3["stage"] == "candidate" and "3" not in stored["aliases"].values()


def test_every_version_traces_to_run_snapshot_ge_results_and_checkpoint_manifest(stored):
    import mlflow

    from mlops.lineage import Tag
    from mlops.run_store import load_run_json

    client = mlflow.MlflowClient()
    snapshots = set()
    for v in stored["versions"]:
        run = client.get_run(v["run_id"])
        tags = run.data.tags
        assert tags[Tag.SNAPSHOT_ID] == v["snapshot_id"] and tags[Tag.MODEL_ID] == v["content_id"]
        assert tags[Tag.CHECKPOINT_MANIFEST].startswith(f"runs:/{v['run_id']}/")  # resolvable by any teammate
        data_run = client.get_run(v["data_run_id"])
        assert data_run.data.tags[Tag.SNAPSHOT_ID] == v["snapshot_id"]
        manifest = load_run_json(v["data_run_id"], "snapshot/manifest.json")
        assert manifest["snapshot_id"] == v["snapshot_id"]
        gate = manifest["gate"]  # the GE batch gate's results, batch by batch, in the data run's manifest
        assert gate["expectations"] > 0 and gate["passed"] + gate["quarantined"] > 0
        assert v["gate"] and v["gate"]["eval_run"], v  # each version's gate stood on an eval run of it
        eval_run = client.get_run(v["gate"]["eval_run"])
        assert eval_run.data.tags[Tag.MODEL_KEY] == v["content_id"]
        snapshots.add(v["snapshot_id"])
    assert len(snapshots) == 3  # round 1, round 2 (mixed with round 1), the leaky round
    round2 = load_run_json(stored["versions"][1]["data_run_id"], "snapshot/manifest.json")
    assert round2["config"]["mix"]["history"]["snapshot"] == stored["versions"][0]["snapshot_id"]
    # Round 1 ran the model-based steps too: semantic dedup and the perplexity filter, reported before and after.
    round1 = load_run_json(stored["versions"][0]["data_run_id"], "snapshot/manifest.json")
    assert round1["dedup"]["semantic"]["records"] > 0 and round1["acceptance"]["perplexity"]


def test_the_served_version_switched_on_promotion_and_back_on_rollback(stored):
    served = [s["to"] for s in stored["serving"]]
    assert served == ["1", "2", "1"]


def test_shadow_evidence_and_the_harvested_round3_increment(loop, stored):
    from mlops.requestlog import read_requests

    shadow = read_requests(model="support-bot", version="2", role="shadow")
    assert len(shadow) >= 4 and all(r["parent_id"] for r in shadow)
    home = loop["home"]
    accepted = (home / "data/harvest/round3/accepted.jsonl").read_text().splitlines()
    provenance = json.loads((home / "data/harvest/round3/accepted.jsonl.provenance.json").read_text())
    assert accepted and len(provenance["requests"]) == len(accepted)
    # `mlops loop check` opened round 3 (the increment reached registry.loop.min_increment) and built its snapshot,
    # mixed with production's own (v1: round 1)
    from mlops.run_store import find_runs

    decision = find_runs({"mlops.stage": "loop", "mlops.loop.decision": "open"}, max_results=1)[0]
    round3 = decision.data.tags["mlops.data_snapshot_id"]
    from mlops.data.snapshot import list_snapshots

    manifest = next(m for m in list_snapshots() if m["snapshot_id"] == round3)
    assert manifest["mixing"]["history"]["snapshot"] == stored["versions"][0]["snapshot_id"]
    assert manifest["sources"][0]["provenance"]["requests"] == provenance["requests"]


def test_the_quick_look_releases_and_serves_one_round_and_says_what_the_full_demo_adds(loop):
    quick, full = loop["quick"].stdout, loop["first"].stdout
    assert re.findall(r"=== \[(\d+)/5\]", quick) == ["1", "2", "3", "4", "5"] and "quick demo finished" in quick
    assert "v1 is in production and served" in quick and "The full demo (`make demo`) goes on" in quick
    # The full demo goes on from the quick look's round: its headers count to 12, and step 4 was done before.
    assert re.findall(r"=== \[(\d+)/12\]", full) == [str(k) for k in range(1, 13)]
    assert re.search(r"=== \[4/12\] release v1.*\(done before\)", full)
    assert re.search(r"left at this machine's pace", full) and "| step | what | took | reference |" in full
    timings = json.loads((loop["home"] / ".mlops" / "demo" / "timings.json").read_text())
    assert [s["step"] for s in timings["steps"]] == list(range(1, 13))
    from mlflow import MlflowClient

    client = MlflowClient(loop["env"]["MLFLOW_TRACKING_URI"])
    reports = client.search_runs([client.get_experiment_by_name("demo").experiment_id],
                                 "tags.`mlflow.runName` = 'demo-report'", order_by=["attributes.start_time DESC"])
    assert reports and {a.path for a in client.list_artifacts(reports[0].info.run_id, "demo")} == {
        "demo/timings.md", "demo/timings.json"}  # the closing table, an artifact of the demo's report run


def test_a_rerun_reuses_everything_and_tells_the_same_story(loop, stored):
    rerun = _demo(loop["home"], loop["env"])
    assert "demo finished" in rerun.stdout
    from registry.report import release_report

    again = release_report("support-bot")
    assert again["ledger"] == stored["ledger"] and again["aliases"] == stored["aliases"]
    assert [v["run_id"] for v in again["versions"]] == [v["run_id"] for v in stored["versions"]]


def test_the_mlflow_ui_shows_runs_named_by_stage_model_and_round(loop, stored, tmp_path):
    """What a newcomer sees in `mlflow ui`: the demo experiment's runs by name, a training run whose metrics lead
    with the loss, and a model version page; screenshots go to the test artifacts folder."""
    import shutil
    import time
    import urllib.request

    from tests.test_app_browser import CHROMIUM, WAIT_MS, artifacts_dir, require_chromium, stop

    require_chromium()
    import mlflow
    from playwright.sync_api import sync_playwright

    from mlops.files import free_port

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("demo")
    names = {r.info.run_name for r in client.search_runs([experiment.experiment_id], max_results=200)}
    assert {"data-round1", "data-round2", "train-round1-tiny", "train-round2-tiny", "train-broken-tiny"} <= names
    assert not any(re.fullmatch(r"[a-z]+-[a-z]+-\d{1,3}", n or "") for n in names)  # no random MLflow names left
    train_run = stored["versions"][0]["run_id"]
    port = free_port()
    ui = subprocess.Popen([shutil.which("mlflow", path=loop["env"]["PATH"]), "ui", "--backend-store-uri",
                           loop["env"]["MLFLOW_TRACKING_URI"], "--port", str(port)], env=loop["env"],
                          stdout=(tmp_path / "ui.log").open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                assert ui.poll() is None and time.time() < deadline, (tmp_path / "ui.log").read_text()[-2000:]
                time.sleep(0.5)
        shots = artifacts_dir()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"])
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.set_default_timeout(WAIT_MS)
            page.goto(f"{url}/#/experiments/{experiment.experiment_id}/runs")  # MLflow 3 opens on GenAI
            page.get_by_text("train-round2-tiny").first.wait_for()
            page.screenshot(path=str(shots / "mlflow-experiment.png"))
            page.goto(f"{url}/#/experiments/{experiment.experiment_id}/runs/{train_run}/model-metrics")
            page.get_by_text("loss").first.wait_for()
            page.wait_for_timeout(5000)  # the charts draw after their titles
            body = page.inner_text("body")
            assert "plan." not in body.split("loss")[0]  # the plan figures are params, not charts above the loss
            page.screenshot(path=str(shots / "mlflow-train-run.png"))
            page.goto(f"{url}/#/models/support-bot/versions/1")
            page.get_by_text("production").first.wait_for()
            page.screenshot(path=str(shots / "mlflow-model-version.png"))
            browser.close()
    finally:
        stop(ui)


# Last in the file: it registers a version, which the tests above do not expect.
def test_make_demo_dpo_runs_a_dpo_round_from_the_demos_feedback_to_the_gate(loop, stored):
    from mlflow import MlflowClient

    from mlops.lineage import Tag
    from registry.report import release_report

    done = subprocess.run([sys.executable, "scripts/demo_dpo.py", "--profile", "tiny"], cwd=loop["home"],
                          env=loop["env"], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
    after = release_report("support-bot")
    new = [v for v in after["versions"] if v["version"] not in {s["version"] for s in stored["versions"]}]
    assert len(new) == 1 and after["aliases"] == stored["aliases"]  # registered, judged, never promoted
    run = MlflowClient(loop["env"]["MLFLOW_TRACKING_URI"]).get_run(new[0]["run_id"])
    assert run.data.tags[Tag.TRAIN_OBJECTIVE] == "dpo"
    assert run.data.tags[Tag.BASE_MODEL].startswith("models:/support-bot/")  # from production's weights
    from registry.gates import newest_gate_report

    _, report = newest_gate_report(new[0]["content_id"])
    judged = [c for c in report["checks"] if c["name"] == "pairs_heldout" and c["rule"] == "must_improve"]
    assert judged, report["checks"]  # the candidate was held to beating production on the held-out pairs
