"""Snapshot builds on Ray (data.executor=ray): a real two-node cluster started with `ray start`, the same snapshot
as the local pool whatever ran it, near duplicates found across partitions, a killed worker retried, a lost head
failing cleanly, and bad input keeping its guarantees."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlops.data.labelled_dedup import conversations
from mlops.data.testing import chat, quick_build
from tests.ray_cluster import RayCluster

REPO = Path(__file__).resolve().parent.parent
TIMING = ("created_at", "build_seconds")
# What says where and how a build ran, not what it made.
EXECUTION = ("executor", "ray", "workers", "output_dir")


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node, one CPU each, 200 MB object stores, stopped (only these processes) at the end."""
    c = RayCluster(nodes=2, cpus_per_node=1, object_store_mb=200)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        assert c.wait_gone() == [], "the test cluster left processes behind"


# (index of an original, index its near duplicate is inserted at): in other partitions (PARTITION_BYTES below).
PLANTED = [(3, 140), (40, 200), (100, 270)]
PARTITION_BYTES = 16384  # ~50 records: each source is cut into several partitions, each its own task


def resent(messages: list[dict]) -> list[dict]:
    """The same request sent again with a greeting and a sign-off: a near duplicate (Jaccard ~0.9), not exact."""
    first, *rest = messages
    return [{**first, "content": f"Hello again, {first['content']} Many thanks in advance."}, *rest]


def corpus() -> list:
    """~300 records over several partitions, each its own Ray task: near duplicates planted in other partitions
    than their originals, PII, an eval leak, a filtered record, rows that are not records."""
    records = [{**row, "domain": "domain" if i % 3 else "general"} for i, row in enumerate(conversations(290, seed=5))]
    for original, at in PLANTED:  # the original in chunk 0, its resent copy in chunk 1 or 2
        records.insert(at, {**records[original], "messages": resent(records[original]["messages"])})
    records += [
        chat("Please update my email to jane.doe@example.com and call +1 415-555-0132 today.",
             "Done, both are updated on your profile now."),
        chat("A customer says their router lights blink orange after a storm and the internet is down. What now?",
             "Check the cables first, then restart the router and wait two minutes."),
        chat("Why was I charged twice this month on my fiber plan, again?", "Ok"),
        '{"messages": [',
        {"question": "?"},
    ]
    return records


def eval_file(folder: Path) -> str:
    path = folder / "evals.jsonl"
    prompt = "A customer says their router lights blink orange after a storm and the internet is down. What now?"
    path.write_text(json.dumps({"id": "sup-001", "prompt": prompt}) + "\n")
    return str(path)


def build(tiny_model, workdir: Path, out: str, records=None, **data):
    data.setdefault("on_bad_record", "skip")
    data.setdefault("decontam", {"eval_sets": [eval_file(workdir)]})
    return quick_build(corpus() if records is None else records, base_model=tiny_model["path"], workdir=workdir,
                       output_dir=str(workdir / out), **data)


def contents(result) -> dict:
    """Every file of a snapshot (shards, quarantine, reports, dedup index) by path, and its manifest without the
    fields that say when, where and how it was built."""
    files = {p.relative_to(result.path).as_posix(): p.read_bytes() for p in sorted(result.path.rglob("*"))
             if p.is_file() and p.name != "manifest.json"}
    manifest = {k: v for k, v in result.manifest.items() if k not in TIMING}
    # The checkout's commit: others commit to a shared checkout while a module's builds run.
    manifest["pipeline"] = {k: v for k, v in manifest["pipeline"].items() if k not in ("git_commit", "git_dirty")}
    manifest["config"] = {k: v for k, v in manifest["config"].items() if k not in EXECUTION}
    return {"id": result.snapshot_id, "files": files, "manifest": manifest}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """This module's project home and input folder (sources and eval sets resolve the same in every build)."""
    folder = tmp_path_factory.mktemp("ray-build")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLOPS_HOME", str(folder))
        mp.setattr("mlops.data.partitions.PARTITION_BYTES", PARTITION_BYTES)  # the driver plans the cuts
        yield folder


@pytest.fixture(scope="module")
def local(tiny_model, work):
    """The reference: the same corpus built by the local process pool."""
    return work, contents(build(tiny_model, work, "local", workers=2))


def on_cluster(cluster, **ray) -> dict:
    return {"executor": "ray", "ray": {"address": cluster.address, **ray}}


@pytest.fixture(scope="module")
def two_nodes(cluster, local, tiny_model):
    """The same corpus built on both nodes of the cluster, and what the executor logged about where tasks ran."""
    work, _ = local
    handler = Collect()
    log = logging.getLogger("mlops.data.ray_executor")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        result = build(tiny_model, work, "ray-2", **on_cluster(cluster))
    finally:
        log.removeHandler(handler)
    return result, handler.lines


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.slow  # heavy end-to-end: the default run stays under 15 minutes; CI runs it
def test_a_two_node_ray_build_is_the_local_snapshot_byte_for_byte(two_nodes, local):
    _, expected = local
    result, log = two_nodes
    got = contents(result)
    assert got["id"] == expected["id"]
    assert got["manifest"] == expected["manifest"]
    assert got["files"].keys() == expected["files"].keys() and got["files"] == expected["files"]
    (line,) = [x for x in log if "tasks on" in x]
    assert "on 2 node(s)" in line, line  # both nodes did work
    c = got["manifest"]["counters"]
    assert c["dedup.near"] >= 3 and c["pii.email"] == 1 and c["decontam.eval_overlap"] == 1
    assert c["bad_input.malformed_json"] == 1 and c["bad_input.unknown_shape"] == 1


@pytest.mark.slow  # heavy end-to-end: the default run stays under 15 minutes; CI runs it
def test_near_duplicates_in_other_partitions_than_their_originals_are_found(two_nodes):
    """Signatures are computed in whichever task holds the record; the band tasks see every partition's band
    hashes, so a pair split across tasks (and nodes) is proposed and confirmed by its Jaccard as locally."""
    from mlops.data.partitions import plan_partitions
    from mlops.data.records import record_id

    result, _ = two_nodes
    source = result.manifest["sources"][0]
    cuts = [p.first_line for p in plan_partitions([{**source, "path": Path(source["name"])}], PARTITION_BYTES)]
    lines = [json.loads(x) for x in (result.path / "quarantine" / "records.jsonl").read_text().splitlines()]
    near = {r["line"]: r for r in lines if r["reason"] == "near"}
    rows = corpus()
    for original, at in PLANTED:
        assert sum(c <= original + 1 for c in cuts) < sum(c <= at + 1 for c in cuts)  # in different partitions
        assert at + 1 in near, f"the near duplicate at line {at + 1} was kept"
        assert near[at + 1]["duplicate_of"] == record_id("chat", rows[original]["messages"])
        assert 0.7 <= near[at + 1]["similarity"] < 1


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["clean_partition", "band_task", "write_group"])
def test_a_worker_killed_mid_build_is_retried_and_the_snapshot_is_unchanged(cluster, local, tiny_model, monkeypatch,
                                                                              stage):
    from mlops.data.ray_executor import KILL_ONCE_ENV

    work, expected = local
    marker = work / f"killed-{stage}"
    monkeypatch.setenv(KILL_ONCE_ENV, f"{marker}:{stage}")
    got = contents(build(tiny_model, work, f"ray-kill-{stage}", **on_cluster(cluster)))
    pid, name = marker.read_text().split()
    assert name == stage and not Path(f"/proc/{pid}").exists()  # a worker really died in that stage
    assert got["id"] == expected["id"] and got["manifest"]["counters"] == expected["manifest"]["counters"]
    assert got["files"] == expected["files"]  # no record lost or written twice


@pytest.mark.slow
@pytest.mark.parametrize("ray", [{"max_in_flight": 1}, {"num_cpus": 1}, {"num_cpus": 0.5}],
                         ids=["1-worker", "2-workers", "4-workers"])
def test_one_two_or_four_ray_workers_give_the_same_snapshot(cluster, local, tiny_model, ray):
    work, expected = local
    got = contents(build(tiny_model, work, f"ray-{'-'.join(f'{k}{v}' for k, v in ray.items())}",
                         **on_cluster(cluster, **ray)))
    assert got["id"] == expected["id"] and got == expected


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_a_private_ray_without_a_cluster_gives_the_same_snapshot(local, tiny_model, workers):
    work, expected = local
    got = contents(build(tiny_model, work, f"private-{workers}", executor="ray", workers=workers))
    assert got["id"] == expected["id"] and got["files"] == expected["files"]
    assert got["manifest"] == expected["manifest"]


@pytest.mark.slow
def test_bad_input_under_ray_fails_naming_the_file_or_costs_only_its_row(cluster, tiny_model, tmp_path, mlops_home):
    from mlops.data.records import BadInputError

    records = conversations(10, seed=1) + ['{"messages": [', {"question": "?"}]
    with pytest.raises(BadInputError, match=r"records.jsonl, line 11: malformed JSON"):
        quick_build(records, base_model=tiny_model["path"], workdir=tmp_path, **on_cluster(cluster))
    bad = [  # each costs only itself (tests/test_data_build.py: test_under_skip_every_kind_of_bad_record_...)
        {"messages": [{"role": "assistant", "content": "Hello jane.doe@example.com, how can I help you today?"},
                      {"role": "user", "content": "My router is broken again since Monday night."}]},
        {"text": {"body": "jane.doe@example.com"}},
        {"messages": [{"role": "user", "content": "What is my plan called, jane.doe@example.com asks?"}]},
        chat("Why was I charged twice for the March invoice on my fiber plan?", "Yes."),
    ]
    records = conversations(24, seed=2) + bad
    local = contents(quick_build(records, base_model=tiny_model["path"], workdir=tmp_path, name="skip.jsonl",
                                 on_bad_record="skip", output_dir=str(tmp_path / "local")))
    ray = contents(quick_build(records, base_model=tiny_model["path"], workdir=tmp_path, name="skip.jsonl",
                               on_bad_record="skip", output_dir=str(tmp_path / "ray"), **on_cluster(cluster)))
    assert ray == local
    c = ray["manifest"]["counters"]
    assert c["bad_input.role_order"] == 1 and c["bad_input.wrong_type"] == 1 and c["cleaning.kept"] == 24
    quarantined = b"".join(v for k, v in ray["files"].items() if k.startswith("quarantine/"))
    assert b"jane.doe" not in quarantined


def test_ray_settings_are_checked_and_leave_the_snapshot_id_alone(tmp_path):
    from mlops.config import config_hash
    from mlops.data.inputs import pipeline_hash
    from mlops.data.testing import quick_config
    from mlops.errors import ConfigError

    src = tmp_path / "a.jsonl"
    src.write_text("{}\n")
    plain = quick_config([src], "tiny")
    on_ray = quick_config([src], "tiny", executor="ray", ray={"address": "10.0.0.5:6379", "num_cpus": 0.5,
                                                              "max_in_flight": 8, "max_retries": 5})
    assert config_hash(plain) == config_hash(on_ray)
    assert pipeline_hash(plain.data, 1) == pipeline_hash(on_ray.data, 1)
    with pytest.raises(ConfigError, match=r"ray.address.*'http://head' is not a Ray address.*Fix"):
        quick_config([src], "tiny", executor="ray", ray={"address": "http://head"})
    with pytest.raises(ConfigError, match=r"executor"):
        quick_config([src], "tiny", executor="spark")
    with pytest.raises(ConfigError, match=r"adress"):
        quick_config([src], "tiny", ray={"adress": "auto"})


def test_a_cluster_that_is_not_there_fails_at_once_naming_the_address_and_the_fix(tiny_model, tmp_path, mlops_home):
    from mlops.data.ray_executor import RayUnavailable
    from tests.ray_cluster import free_port

    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(RayUnavailable, match=rf"nothing answers at data.ray.address={address}.*ray start --head"):
        quick_build(conversations(5), base_model=tiny_model["path"], workdir=tmp_path, executor="ray",
                    ray={"address": address})
    assert not list(tmp_path.rglob("manifest.json")) and not list(tmp_path.rglob(".staging-*"))


# --------------------------------------------------------------------------- the head lost mid-build (real CLI)


def cli_build(home: Path, config: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLOPS_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "mlops", "data", "build", "--config", str(config), *overrides],
                          cwd=home, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_losing_the_head_fails_clearly_publishes_nothing_and_a_rerun_completes(mlops_home, tiny_model):
    import threading
    import time

    from tests.test_data_failure import write_config

    config = write_config(mlops_home, tiny_model, records=1500)
    root = mlops_home / ".mlops" / "snapshots"
    doomed = RayCluster(nodes=2).start()
    try:
        def kill_when_cleaning() -> None:  # a partition task has started writing its rows: tasks are in flight
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not list(root.glob(".staging-*/.work/parts/*/rows.jsonl")):
                time.sleep(0.2)
            doomed.kill_head()
            killed_at.append(time.monotonic())

        killed_at: list[float] = []
        killer = threading.Thread(target=kill_when_cleaning, daemon=True)
        killer.start()
        failed = cli_build(mlops_home, config, "data.executor=ray", f"data.ray.address={doomed.address}",
                           "data.ray.head_timeout_s=3")
        ended = time.monotonic()
        killer.join(5)
    finally:
        doomed.stop()
    assert failed.returncode != 0 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    # Ray either stops answering (the probe gives up after head_timeout_s) or resets the driver's link at once.
    assert re.search(rf"the Ray head at {re.escape(doomed.address)} (stopped answering|was lost)",
                     failed.stderr), failed.stderr[-3000:]
    assert "Fix: restart the head" in failed.stderr and "nothing was published" in failed.stderr
    # Counted from the head's loss, not the build's start: a loaded machine may take long to get that far.
    assert killed_at, "the head was never killed: no partition task wrote rows within 300 s"
    assert ended - killed_at[0] < 55, "the build must fail before Ray itself ends the driver (60 s without a head)"
    assert not [p for p in root.iterdir() if p.name.startswith(("snap-", ".staging"))]

    again = RayCluster(nodes=2).start()
    try:
        done = cli_build(mlops_home, config, "data.executor=ray", f"data.ray.address={again.address}")
    finally:
        again.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    (snapshot,) = [p for p in root.iterdir() if p.name.startswith("snap-")]
    here = cli_build(mlops_home, config, "data.executor=local", f"data.output_dir={mlops_home / 'local'}")
    assert here.returncode == 0 and f"snapshot {snapshot.name}" in here.stdout
