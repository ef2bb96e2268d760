"""`mlops train checkpoints prune`: after release, only the checkpoints no registered version needs go."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from typer.testing import CliRunner

from mlops.lineage import Tag
from training.checkpoint import MANIFEST, atomic_json, file_table, tag_for
from training.prune import VersionRecord, apply, describe, plan_prune
from training.results import FINAL

SIZE = 4096


def checkpoint(folder: Path, step: int, run_id: str = "run-1", universal: bool = False) -> Path:
    """A complete checkpoint as the saver leaves it (a weights file, then the manifest), with a universal copy."""
    tag = tag_for(step)
    ckpt = folder / tag
    ckpt.mkdir(parents=True)
    (ckpt / "mp_rank_00_model_states.pt").write_bytes(b"w" * SIZE)
    atomic_json(ckpt / MANIFEST, {"run_id": run_id, "config_hash": "c" * 64, "step": step, "tag": tag,
                                  "files": file_table(ckpt), "complete": True})
    if universal:
        (folder / "universal" / tag).mkdir(parents=True)
        (folder / "universal" / tag / "zero.pt").write_bytes(b"u" * SIZE)
        (folder / "universal" / tag / ".complete").write_text("ok\n")
    return ckpt


def released(folder: Path, steps=(10, 20, 30, 40), selected: int = 20, run_id: str = "run-1") -> Path:
    """A finished run's folder: its checkpoints (universal copies too), a quarantined one, an incident and final.json
    naming the selected best (not the newest)."""
    for step in steps:
        checkpoint(folder, step, run_id, universal=True)
    (folder / "corrupt" / "step-00000005-20261207T000000").mkdir(parents=True)
    (folder / "incidents").mkdir()
    (folder / "incidents" / "nan-step-7.json").write_text("{}")
    atomic_json(folder / FINAL, {"run_id": run_id, "status": "FINISHED", "steps": max(steps),
                                 "checkpoint": str(folder / tag_for(selected)), "config_hash": "c" * 64})
    return folder


def version(n: int, named: Path | str | None = None, run_id: str = "run-1", **tags) -> VersionRecord:
    tags = {Tag.SOURCE_RUN: run_id, **({Tag.SELECTED_CHECKPOINT: str(named)} if named else {}), **tags}
    return VersionRecord("bot", str(n), run_id, tags)


def tags_left(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("step-*")}


def test_a_dry_run_deletes_nothing_and_lists_what_would_go(tmp_path):
    folder = released(tmp_path / "abc")
    plan = plan_prune(tmp_path, [])
    [fp] = plan.folders
    assert set(fp.delete) == {"step-00000010", "step-00000030", "step-00000040"}
    assert fp.keep == {"step-00000020": ["selected best (final.json)"]}
    doomed = [folder / d / t for t in fp.delete for d in (".", "universal")]
    assert plan.bytes == sum(f.stat().st_size for d in doomed for f in d.rglob("*") if f.is_file()) > 6 * SIZE
    assert tags_left(folder) == {"step-00000010", "step-00000020", "step-00000030", "step-00000040"}
    text = " ".join(describe(plan).split())
    assert "dry run: nothing deleted" in text and "delete step-00000040" in text and "would free" in text
    assert "keep step-00000020 selected best (final.json)" in text


def test_apply_deletes_exactly_the_unneeded_checkpoints_and_their_universal_copies(tmp_path):
    folder = released(tmp_path / "abc")
    plan = plan_prune(tmp_path, [version(1, folder / "step-00000030")])
    deleted, errors = apply(plan)
    assert errors == []
    assert tags_left(folder) == {"step-00000020", "step-00000030"}
    assert {p.name for p in (folder / "universal").iterdir()} == {"step-00000020", "step-00000030"}
    assert set(deleted) == {str(folder / t) for t in ("step-00000010", "step-00000040")} | {
        str(folder / "universal" / t) for t in ("step-00000010", "step-00000040")}
    assert sum(deleted.values()) == plan.bytes
    assert (folder / FINAL).is_file() and (folder / "incidents" / "nan-step-7.json").is_file()
    assert (folder / "corrupt" / "step-00000005-20261207T000000").is_dir()
    assert not list(folder.glob(".partial-*"))
    assert json.loads((folder / ".train.lock").read_text())["released"] is True  # deleted under the lock
    assert plan_prune(tmp_path, [version(1, folder / "step-00000030")]).bytes == 0  # nothing more to do


def test_the_selected_best_is_never_deleted_even_when_it_is_not_the_newest(tmp_path):
    folder = released(tmp_path / "abc", steps=(10, 20, 30), selected=10)
    apply(plan_prune(tmp_path, []))
    assert tags_left(folder) == {"step-00000010"}


def test_a_checkpoint_a_registered_version_names_is_kept_though_not_the_selected_one(tmp_path):
    folder = released(tmp_path / "teams" / "a" / "abc", steps=(10, 20, 30, 40, 50), selected=50)
    moved = Path("/mnt/elsewhere/checkpoints/teams/a/abc/step-00000010")  # the same folder on another mount
    old = checkpoint(tmp_path / "teams" / "a" / "abc", 60, run_id="run-0")  # an older run's version, no tag
    atomic_json(folder / FINAL, {**json.loads((folder / FINAL).read_text()), "steps": 60})
    versions = [version(1, folder / "step-00000030"), version(2, moved, run_id="other"),
                version(3, run_id="run-0", **{Tag.CHECKPOINT_MANIFEST: "runs:/run-0/checkpoints/step-00000060/"
                                                                         "manifest.json"}),
                version(4, "/somewhere/else/step-00000001", run_id="unrelated")]
    plan = plan_prune(tmp_path, versions)
    [fp] = plan.folders
    assert fp.keep["step-00000030"] == ["named by models:/bot/1"]
    assert fp.keep["step-00000010"] == ["named by models:/bot/2"]
    assert fp.keep[old.name] == ["named by models:/bot/3 (via run run-0)"]
    assert set(fp.delete) == {"step-00000020", "step-00000040"}
    assert any("models:/bot/4" in note and "not under" in note for note in plan.notes)
    apply(plan)
    assert tags_left(folder) == {"step-00000010", "step-00000030", "step-00000050", "step-00000060"}


def test_a_folder_is_kept_whole_when_what_a_version_needs_cannot_be_told(tmp_path):
    folder = released(tmp_path / "abc")
    checkpoint(tmp_path / "abc", 5, run_id="run-0")
    plan = plan_prune(tmp_path, [version(1, run_id="run-0")])  # no selected tag, no manifest URI, not final.json's run
    assert "unknown what registered versions need" in plan.folders[0].skipped and plan.bytes == 0
    apply(plan)
    assert len(tags_left(folder)) == 5


def test_a_folder_whose_run_is_in_progress_is_skipped_whole(tmp_path):
    from training.lock import TrainLock

    running = tmp_path / "running"  # no final.json: training now, or killed and will resume
    for step in (10, 20):
        checkpoint(running, step)
    locked = released(tmp_path / "locked")  # finished once, training again under a changed config
    lock = TrainLock(locked).acquire(worker_wait=0.0)
    trained_on = released(tmp_path / "trained-on")  # a later run went past final.json's step and was killed
    checkpoint(trained_on, 50)
    killed = released(tmp_path / "killed")  # a later run was SIGKILLed before its first checkpoint
    (killed / ".train.lock").write_text(json.dumps({"pid": 2**22 + 1, "host": socket.gethostname(), "created": 1.0,
                                                    "released": False, "run_id": "run-2"}))
    try:
        plan = plan_prune(tmp_path, [])
        reasons = {f.folder.name: f.skipped for f in plan.folders}
        assert reasons["running"].startswith("no final.json: a run in progress")
        assert reasons["locked"].startswith("run in progress: training as pid")
        assert "step-00000050 is newer than final.json's steps=40" in reasons["trained-on"]
        assert "run run-2) died without releasing the lock" in reasons["killed"]
        assert plan.bytes == 0
        apply(plan)
    finally:
        lock.release()
    assert len(tags_left(running)) == 2 and len(tags_left(locked)) == 4 and len(tags_left(trained_on)) == 5
    assert len(tags_left(killed)) == 4


def test_the_cli_prunes_with_the_registry_dry_run_first(mlops_home, monkeypatch):
    from mlops.tracking import MlflowTracker, client
    from training.cli import app

    monkeypatch.delenv("MLOPS_CHECKPOINTS_DIR", raising=False)
    root = mlops_home / ".mlops" / "checkpoints"
    folder = released(root / "teams" / "a" / "abc", run_id="pending")
    run = MlflowTracker.start("prune", run_name="trained")
    run.close()
    final = json.loads((folder / FINAL).read_text())
    atomic_json(folder / FINAL, {**final, "run_id": run.run_id})
    c = client()
    c.create_registered_model("bot")
    c.create_model_version("bot", str(mlops_home), run_id=run.run_id,
                           tags={Tag.SOURCE_RUN: run.run_id, Tag.SELECTED_CHECKPOINT: str(folder / "step-00000040")})
    runner = CliRunner()
    dry = runner.invoke(app, ["checkpoints", "prune"])
    assert dry.exit_code == 0, dry.output
    assert "named by models:/bot/1" in dry.output and "would free" in dry.output
    assert len(tags_left(folder)) == 4
    done = runner.invoke(app, ["checkpoints", "prune", "--root", str(root), "--apply", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["applied"] and report["freed_bytes"] == report["bytes"] > 0
    assert tags_left(folder) == {"step-00000020", "step-00000040"}
    listed = runner.invoke(app, ["checkpoints", "--dir", str(folder)])  # listing stays the default
    assert listed.exit_code == 0 and [r["step"] for r in json.loads(listed.output)] == [40, 20]
    missing = runner.invoke(app, ["checkpoints", "prune", "--root", str(mlops_home / "nope")])
    assert missing.exit_code != 0 and "is not a folder" in str(missing.exception)
