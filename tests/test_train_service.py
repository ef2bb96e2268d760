"""The training service's rules and refusals, without a cluster: queue order, team limits, ETAs, quotas, metering
sums, the fences between teams, and every bad submission refused before anything is written. The real cluster
(head and worker-node processes, a node killed mid-run) is tests/test_train_service_cluster.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mlops.errors import ConfigError, MLOpsError
from mlops.identities import AuthError
from training.queue_rules import (
    TRAINING,
    WAITING,
    Job,
    estimate_starts,
    may_start,
    next_to_start,
    queue_order,
    quota_view,
)

REPO = Path(__file__).resolve().parent.parent
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing answers there


def job(job_id, team="a", priority="normal", state=WAITING, submitted=0.0, devices=2, hours=1.0, started=None):
    return Job(job_id, team, "u", priority, state, submitted, devices, hours, started=started)


# --------------------------------------------------------------------------- the queue rule (pure)


def test_waiting_jobs_start_by_priority_then_submission_time():
    jobs = [job("low", priority="low", submitted=1), job("n2", submitted=3), job("n1", submitted=2),
            job("hi", priority="high", submitted=9), job("run", state=TRAINING)]
    assert [j.job_id for j in queue_order(jobs)] == ["hi", "n1", "n2", "low"]


def test_a_team_at_its_concurrency_limit_is_skipped_not_waited_on():
    jobs = [job("a-run", team="a", state=TRAINING), job("a-next", team="a", priority="high", submitted=1),
            job("b-next", team="b", submitted=2)]
    assert next_to_start(jobs, {"a": 1, "b": 1}).job_id == "b-next"
    assert may_start("b-next", jobs, {"a": 1, "b": 1}, free_devices=2) == (True, "its turn, and its devices are free")
    ok, reason = may_start("a-next", jobs, {"a": 1, "b": 1}, free_devices=2)
    assert not ok and "max_concurrent" in reason
    assert next_to_start(jobs, {"a": 2, "b": 1}).job_id == "a-next"  # a raised limit lets team a go first


def test_the_first_eligible_job_is_never_jumped_by_a_smaller_one():
    jobs = [job("big", devices=4, submitted=1), job("small", devices=1, submitted=2)]
    ok, reason = may_start("small", jobs, {"a": 2}, free_devices=2)
    assert not ok and "big" in reason
    ok, reason = may_start("big", jobs, {"a": 2}, free_devices=2)
    assert not ok and "2 of the 4 devices" in reason


def test_eta_replays_the_queue_over_planned_wall_times():
    now = 1000.0
    jobs = [job("run", state=TRAINING, started=now - 1800, hours=2.0),  # 2 devices x 1 h: ends in 30 min
            job("b1", team="b", priority="high", submitted=5, hours=1.0),  # 30 min on 2 devices
            job("a2", submitted=1, hours=2.0)]
    starts = estimate_starts(jobs, {"a": 1, "b": 1}, capacity=2, now=now)
    assert starts["b1"] == pytest.approx(now + 1800)
    assert starts["a2"] == pytest.approx(now + 3600)
    assert estimate_starts([job("huge", devices=8)], {"a": 1}, capacity=2, now=now) == {}  # never fits


def test_quota_charges_metered_hours_and_holds_what_live_jobs_may_still_use():
    now = time.time()
    live = [job("j-run", state=TRAINING, started=now - 900, hours=1.0),  # 2 devices x 15 min = 0.5 h used
            job("j-wait", hours=0.25), job("other", team="b", hours=9.0)]
    view = quota_view("a", 10.0, "2026-12", {"j-old": 3.0}, live, now)
    assert view.metered == pytest.approx(3.5, abs=1e-3)
    assert view.reserved == pytest.approx(0.5 + 0.25, abs=1e-3)
    assert view.left == pytest.approx(10 - 3.5 - 0.75, abs=1e-3)


# --------------------------------------------------------------------------- the policy's teams


def test_team_policy_refuses_bad_team_names_and_grants():
    from registry.config import RegistryConfig

    with pytest.raises(Exception, match="team name 'Team A'"):
        RegistryConfig.model_validate({"teams": {"Team A": {"members": ["x"], "quota_device_hours": 1}}})
    with pytest.raises(Exception, match="snapshot:<id> nor model:<name>/<version>"):
        RegistryConfig.model_validate({"teams": {"ta": {"members": ["x"], "quota_device_hours": 1,
                                                        "granted": ["model:bot"]}}})


# --------------------------------------------------------------------------- refusals before anything is written


def _seed_teams(home: Path, policy: Path) -> None:
    """A registry whose signed policy holds team-a (tina) and team-b (tom), and a snapshot of each, in `home`."""
    from mlops.tenancy import team_snapshots_dir
    from registry.identities import add_user, set_policy
    from registry.testing import make_identities
    from training.testing import make_snapshot

    ids = make_identities()
    add_user(ids["admin"], "tom", "trainer", "Second-Trainer-2026")
    policy.write_text("registry:\n  teams:\n    team-a: {members: [tina], quota_device_hours: 1.0}\n"
                      "    team-b: {members: [tom], quota_device_hours: 1.0, default_priority: high}\n")
    set_policy(ids["admin"], policy)
    make_snapshot(team_snapshots_dir("team-a"))
    make_snapshot(team_snapshots_dir("team-b"), train=48)


@pytest.fixture(scope="module")
def teams_template(tmp_path_factory) -> Path:
    """The seeded store, built once per module (six identities' keys take seconds to seal)."""
    home = tmp_path_factory.mktemp("teams") / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLOPS_HOME", str(home))
        mp.setenv("MLOPS_LEDGER_KEY_DIR", str(home / "ledger-keys"))
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLOPS_REGISTRY_DB"):
            mp.setenv(name, "")
            mp.delenv(name)
        _seed_teams(home, home.parent / "teams.yaml")
    return home


@pytest.fixture
def teams(teams_template, mlops_home, monkeypatch):
    """This test's own copy of the seeded store: its database, snapshots and the registry's keys."""
    import os
    import shutil

    from mlops.data.snapshot import list_snapshots
    from mlops.tenancy import team_snapshots_dir

    monkeypatch.delenv("MLOPS_REGISTRY_DB", raising=False)
    shutil.copytree(teams_template / ".mlops", mlops_home / ".mlops", dirs_exist_ok=True)
    shutil.copytree(teams_template / "ledger-keys", os.environ["MLOPS_LEDGER_KEY_DIR"])
    monkeypatch.setenv("MLOPS_USER", "tina")
    monkeypatch.setenv("MLOPS_PASSWORD", "Trainer-Key-2026")
    snaps = {t: list_snapshots(team_snapshots_dir(t))[0]["snapshot_id"] for t in ("team-a", "team-b")}
    return {"snapshots": snaps}


def cfg_for(tiny_model, snapshot, *extra):
    from mlops.config import load_config
    from training.testing import tiny_overrides

    return load_config(REPO / "configs/train/tiny.yaml", tiny_overrides(
        snapshot, base_model=tiny_model["path"], **{"train.cluster.address": CLOSED}) + list(extra))


def nothing_written(home: Path) -> None:
    from mlops.lineage import Tag
    from mlops.run_store import find_runs

    assert find_runs({}, status=None, having=(Tag.JOB_ID,)) == []
    assert not (home / ".mlops" / "checkpoints").exists()
    assert not (home / ".mlops" / "ray").exists()  # no local head was started either


def test_unknown_team_is_refused_naming_the_teams(teams, tiny_model, mlops_home):
    from training.submit import submit

    with pytest.raises(ConfigError, match="unknown team 'team-c'.*did you mean"):
        submit(cfg_for(tiny_model, teams["snapshots"]["team-a"]), team="team-c")
    nothing_written(mlops_home)


def test_user_outside_the_team_is_refused(teams, tiny_model, mlops_home):
    from training.submit import submit

    with pytest.raises(AuthError, match="'tina' is not a member of team team-b"):
        submit(cfg_for(tiny_model, teams["snapshots"]["team-b"]), team="team-b")
    nothing_written(mlops_home)


def test_another_teams_snapshot_needs_an_admins_grant(teams, tiny_model, mlops_home):
    from registry.config import RegistryConfig
    from training.tenants import scope_snapshot

    theirs = teams["snapshots"]["team-b"]
    policy = RegistryConfig.model_validate({"teams": {
        "team-a": {"members": ["tina"], "quota_device_hours": 1}, "team-b": {"members": ["tom"], "quota_device_hours": 1}}})
    with pytest.raises(AuthError, match=f"snapshot {theirs} belongs to team team-b.*snapshot:{theirs}"):
        scope_snapshot(theirs, "team-a", policy.teams)
    policy.teams["team-a"].granted = [f"snapshot:{theirs}"]
    sid, root = scope_snapshot(theirs, "team-a", policy.teams)
    assert sid == theirs and root.name == "team-b"
    from training.submit import submit

    with pytest.raises(AuthError, match="belongs to team team-b"):  # the signed policy grants nothing
        submit(cfg_for(tiny_model, theirs), team="team-a")
    nothing_written(mlops_home)


def test_checkpoint_folder_outside_the_team_prefix_is_refused(teams, tiny_model, mlops_home, tmp_path):
    from training.submit import submit

    cfg = cfg_for(tiny_model, teams["snapshots"]["team-a"], f"train.checkpoint.dir={tmp_path / 'elsewhere'}")
    with pytest.raises(AuthError, match="outside team team-a's prefix"):
        submit(cfg, team="team-a")
    nothing_written(mlops_home)


def test_a_config_the_plan_refuses_is_not_queued(teams, tiny_model, mlops_home):
    from training.submit import submit

    cfg = cfg_for(tiny_model, teams["snapshots"]["team-a"], "train.micro_batch_size=4000000",
                  "train.max_seq_len=32")
    with pytest.raises(ConfigError, match="the plan refuses this job"):
        submit(cfg, team="team-a")
    with pytest.raises(ConfigError, match="train.cluster.hardware=tpu-v9"):
        submit(cfg_for(tiny_model, teams["snapshots"]["team-a"], "train.cluster.hardware=tpu-v9"), team="team-a")
    nothing_written(mlops_home)


def test_exhausted_quota_is_refused_before_the_cluster_is_asked(teams, tiny_model, mlops_home):
    from mlops.lineage import Tag
    from mlops.tracking import MlflowTracker
    from training.queue_rules import month_of
    from training.submit import QuotaExceeded, submit
    from training.usage import MONTH_TAG

    spent = MlflowTracker.start("team-a/train-tiny", run_name="earlier job")
    spent.set_tags({Tag.TEAM: "team-a", Tag.JOB_ID: "train-team-a-old", Tag.SUBMITTED_BY: "tina",
                    Tag.BASE_MODEL: "tiny", MONTH_TAG: month_of(time.time())})
    spent.log_metrics({"device_hours": 0.9999, "job_devices": 2})
    spent.close()
    with pytest.raises(QuotaExceeded, match=r"team team-a has 0\.0001 of its 1 device-hours left.*0\.9999 metered"):
        submit(cfg_for(tiny_model, teams["snapshots"]["team-a"]), team="team-a")
    assert not (mlops_home / ".mlops" / "checkpoints").exists()


def test_unreachable_cluster_is_refused_naming_the_fix(teams, tiny_model, mlops_home):
    from training.submit import submit

    with pytest.raises(MLOpsError, match="cannot be reached.*Nothing was queued.*Fix"):
        submit(cfg_for(tiny_model, teams["snapshots"]["team-a"]), team="team-a")
    nothing_written(mlops_home)


def test_submit_cli_exits_with_the_error_and_writes_nothing(teams, tiny_model, mlops_home):
    from registry.testing import run_cli

    code, out, err = run_cli("train", "submit", "--config", str(REPO / "configs/train/tiny.yaml"), "--team",
                             "team-a", "--priority", "urgent", f"base_model={tiny_model['path']}",
                             f"train.snapshot={teams['snapshots']['team-a']}", f"train.cluster.address={CLOSED}",
                             env={"MLOPS_USER": "tina", "MLOPS_PASSWORD": "Trainer-Key-2026"})
    assert code == 2 and "--priority urgent is not one of high, normal, low" in out + err
    nothing_written(mlops_home)


# --------------------------------------------------------------------------- metering sums


def test_usage_sums_metered_jobs_per_team_user_model_and_month(mlops_home):
    from mlops.lineage import Tag
    from mlops.tracking import MlflowTracker
    from training.usage import MONTH_TAG, all_rows, prometheus_text, select, summarize

    for job_id, team, user, month, hours in [("j1", "team-a", "tina", "2026-11", 1.5), ("j2", "team-a", "tina",
                                             "2026-12", 0.25), ("j3", "team-a", "tina", "2026-12", 0.5),
                                             ("j4", "team-b", "tom", "2026-12", 2.0)]:
        run = MlflowTracker.start(f"{team}/x", run_name=job_id)
        run.set_tags({Tag.TEAM: team, Tag.JOB_ID: job_id, Tag.SUBMITTED_BY: user, Tag.BASE_MODEL: "tiny",
                      MONTH_TAG: month})
        run.log_metrics({"device_hours": hours, "job_devices": 2, "job_restarts": 0})
        run.close()
    rows = select(all_rows(), month="2026-12")
    totals = {(t["team"], t["user"]): (t["device_hours"], t["jobs"]) for t in summarize(rows)}
    assert totals == {("team-a", "tina"): (0.75, 2), ("team-b", "tom"): (2.0, 1)}
    text = prometheus_text(select(rows, team="team-b"))
    assert 'mlops_training_device_hours{team="team-b",user="tom",model="tiny",month="2026-12"} 2.000000' in text


def test_another_teams_model_version_needs_a_grant(teams, tmp_path):
    from mlops.lineage import Tag
    from mlops.tracking import MlflowTracker, client
    from registry.config import RegistryConfig
    from training.tenants import check_base_model

    run = MlflowTracker.start("team-b/train", run_name="b's model")
    run.set_tags({Tag.TEAM: "team-b"})
    run.close()
    c = client()
    c.create_registered_model("b-bot")
    c.create_model_version("b-bot", str(tmp_path), run_id=run.run_id)
    policy = RegistryConfig.model_validate({"teams": {
        "team-a": {"members": ["tina"], "quota_device_hours": 1}, "team-b": {"members": ["tom"], "quota_device_hours": 1}}})
    with pytest.raises(AuthError, match="b-bot/1 was trained by team team-b.*model:b-bot/1"):
        check_base_model("models:/b-bot/1", "team-a", policy.teams)
    check_base_model("models:/b-bot/1", "team-b", policy.teams)  # its own team
    with pytest.raises(ConfigError, match="numbered version, not an alias"):
        check_base_model("models:/b-bot@production", "team-a", policy.teams)
    policy.teams["team-a"].granted = ["model:b-bot/1"]
    check_base_model("models:/b-bot/1", "team-a", policy.teams)


def test_only_a_jobs_submitter_or_an_admin_attests_its_run(teams, monkeypatch):
    from mlops.lineage import Tag
    from mlops.tracking import MlflowTracker
    from training.attest import attest_job_run

    local = MlflowTracker.start("team-a/x", run_name="a local run")
    local.close()
    with pytest.raises(MLOpsError, match="not a job of the training service"):
        attest_job_run(local.run_id)
    job_run = MlflowTracker.start("team-b/x", run_name="tom's job")
    job_run.set_tags({Tag.SUBMITTED_BY: "tom", Tag.TEAM: "team-b"})
    job_run.close()
    with pytest.raises(AuthError, match="submitted by tom; only they or an admin"):
        attest_job_run(job_run.run_id)  # signed in as tina
    monkeypatch.setenv("MLOPS_USER", "tom")
    monkeypatch.setenv("MLOPS_PASSWORD", "Second-Trainer-2026")
    with pytest.raises(MLOpsError, match="without a final model"):
        attest_job_run(job_run.run_id)


def test_a_jobs_environment_carries_no_secret_and_no_wrapper_run(mlops_home, monkeypatch):
    import json

    from mlops.paths import SNAPSHOTS_ENV
    from training.config import ClusterSection
    from training.submit import SPEC_ENV, job_env

    for name, value in {"MLOPS_USER": "tina", "MLOPS_PASSWORD": "Trainer-Key-2026", "MLFLOW_TRACKING_PASSWORD": "p",
                        "MLFLOW_RUN_ID": "wrapper", "HF_HUB_OFFLINE": "1", "MLOPS_LEDGER_KEY_DIR": "/keys"}.items():
        monkeypatch.setenv(name, value)
    env = job_env({"job_id": "j1"}, Path("/shared/snapshots/teams/team-a"), ClusterSection())
    assert not {"MLOPS_USER", "MLOPS_PASSWORD", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_RUN_ID"} & set(env)
    assert "Trainer-Key-2026" not in json.dumps(env)
    assert env["HF_HUB_OFFLINE"] == "1" and env["MLOPS_LEDGER_KEY_DIR"] == "/keys" and env["DS_ACCELERATOR"] == "cpu"
    assert env[SNAPSHOTS_ENV] == "/shared/snapshots/teams/team-a" and json.loads(env[SPEC_ENV]) == {"job_id": "j1"}
