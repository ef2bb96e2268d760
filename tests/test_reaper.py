"""No run stays RUNNING forever: runs whose process died are marked KILLED with the reason."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from mlops.lineage import Tag


def running_run(tags: dict) -> str:
    from mlops.tracking import client, init_experiment

    _, exp = init_experiment("reap")
    return client().create_run(exp, tags=tags).info.run_id


def dead_process_tags() -> dict:
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    return {Tag.HOST: socket.gethostname(), Tag.PID: str(proc.pid), Tag.PROCESS_START: f"{started:.2f}"}


def test_reap_marks_a_run_whose_process_died_killed_with_the_reason(mlops_home):
    from mlops.tracking import client, process_tags, reap

    dead = running_run(dead_process_tags())
    alive = running_run(process_tags())
    untagged = running_run({})  # started by something that does not say who owns it: left alone
    reaped = reap()
    assert [r.run_id for r in reaped] == [dead]
    run = client().get_run(dead)
    assert run.info.status == "KILLED" and "is gone" in run.data.tags[Tag.REAPED]
    assert client().get_run(alive).info.status == "RUNNING"
    assert client().get_run(untagged).info.status == "RUNNING"


def test_a_reused_pid_is_not_mistaken_for_the_runs_process(mlops_home):
    from mlops.tracking import process_tags, reap

    tags = process_tags()
    tags[Tag.PROCESS_START] = f"{float(tags[Tag.PROCESS_START]) - 3600:.2f}"  # same pid, an older process
    run_id = running_run(tags)
    assert [r.run_id for r in reap()] == [run_id]


def test_a_run_whose_heartbeat_stopped_is_reaped_from_any_host(mlops_home):
    from mlops.tracking import reap

    stale = running_run({Tag.HOST: "other-node", Tag.PID: "1", Tag.HEARTBEAT: str(time.time() - 3600)})
    fresh = running_run({Tag.HOST: "other-node", Tag.PID: "1", Tag.HEARTBEAT: str(time.time())})
    reaped = {r.run_id for r in reap(stale_after=600)}
    assert stale in reaped and fresh not in reaped


def test_tracking_reap_command_lists_then_reaps(mlops_home):
    from typer.testing import CliRunner

    from mlops.cli import app
    from mlops.tracking import client

    run_id = running_run(dead_process_tags())
    dry = CliRunner().invoke(app, ["tracking", "reap", "--dry-run"])
    assert dry.exit_code == 0 and f"would reap run {run_id}" in dry.output
    assert client().get_run(run_id).info.status == "RUNNING"
    done = CliRunner().invoke(app, ["tracking", "reap"])
    assert done.exit_code == 0 and "1 run(s) reaped" in done.output
    assert client().get_run(run_id).info.status == "KILLED"


def test_every_stage_run_records_its_host_and_process(mlops_home):
    import os

    from mlops.tracking import client, tracked_run

    with tracked_run("reap", attach_env_run=False) as run:
        tags = client().get_run(run.run_id).data.tags
    assert tags[Tag.HOST] == socket.gethostname() and tags[Tag.PID] == str(os.getpid())
