"""Test support, outside the layers: for the registry and the approval app: identities, fully-lineaged training runs, stored evidence.

Everything is written through the real stores (MLflow, the ledger); only the training itself is skipped: a run
logs an HF folder as its model with every lineage tag a real training run records.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mlops.lineage import Tag

# Each passes the passphrase rule (`mlops.identities.check_password`): 12+ characters, 3 kinds, no user name.
PASSWORDS = {"admin": "Trust-Root-2026", "tina": "Trainer-Key-2026", "alice": "First-Approver-2026",
             "bob": "Second-Approver-2026", "vic": "Viewer-Reads-2026"}
ROLES = {"admin": "admin", "tina": "trainer", "alice": "approver", "bob": "approver", "vic": "viewer"}


def make_identities() -> dict:
    """A bootstrapped registry (first admin `admin`, the project's release policy) with tina (trainer), alice and
    bob (approvers) and vic (viewer) added by the admin; returns name -> Identity."""
    from registry.config import project_policy
    from registry.identities import add_user, bootstrap

    bootstrap("admin", PASSWORDS["admin"], policy=project_policy())
    admin = signed_in("admin")
    for name, role in ROLES.items():
        if name != "admin":
            add_user(admin, name, role, PASSWORDS[name])
    return {name: signed_in(name) for name in ROLES}


def signed_in(name: str):
    """The identity `name` with their key unlocked, as `MLOPS_USER` + `MLOPS_PASSWORD` would give it."""
    from mlops.identities import authenticate

    return authenticate(name, PASSWORDS[name])


def attest_as(name: str | None, kind: str, subjects: dict, predicate: dict, subject_key: str,
              materials: dict | None = None) -> dict | None:
    """Sign and store a statement as `name` (as the step run signed in as them would); its envelope. Nothing
    without a name or a registry in the store."""
    from registry.attest_store import record
    from registry.attestation import attest
    from registry.resolve import present

    if not name or not present():
        return None
    envelope = attest(signed_in(name).signer, kind, subjects, predicate, materials)
    record(envelope, kind, subject_key, name)
    return envelope


def version_files(model: str, version: str) -> dict:
    from registry.audit import model_state

    return model_state(model).versions[str(version)].evidence["files"]


def data_run(experiment: str = "registry-test", snapshot_id: str = "snap-test", *, admitted_failure: bool = False,
             attester: str | None = "tina"):
    """A finished data run whose artifacts hold a snapshot manifest with GE batch results, attested by
    `attester` (when a registry is there)."""
    from mlops.tracking import MlflowTracker

    batches = [{"batch": 0, "status": "passed", "records": 10}, {"batch": 1, "status": "quarantined",
                                                                   "records": 3, "failed": [{"expectation": "x"}]}]
    if admitted_failure:
        batches[0]["failed"] = [{"expectation": "expect_column_values_to_not_be_null"}]
    tracker = MlflowTracker.start(experiment, attach_env_run=False,
                                  tags={Tag.STAGE: "data", Tag.SNAPSHOT_ID: snapshot_id})
    tracker.log_dict({"snapshot_id": snapshot_id, "batches": batches}, "snapshot/manifest.json")
    tracker.close()
    attest_as(attester, "data", {snapshot_id: "0" * 64},
              {"snapshot_id": snapshot_id, "data_run": tracker.run_id, "batches": 2, "passed_batches": 1,
               "quarantined": 1, "admitted_failures": [0] if admitted_failure else []}, snapshot_id)
    return tracker.run_id


def training_run(hf_dir: Path, *, tmp: Path, variant: int, trainer: str | None = "tina",
                 experiment: str = "registry-test", data_run_id: str | None = None, drop: tuple = (),
                 signer: str | None = None) -> str:
    """A finished training run that logged a variant of `hf_dir` (distinct weights per variant) with full lineage,
    tagged with `trainer` and attested by `signer` (default: the trainer; "" signs nothing)."""
    from mlops.model_refs import model_content_id
    from mlops.profile import load_profile
    from mlops.tracking import MlflowTracker

    folder = tmp / f"model-v{variant}"
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copytree(hf_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "mlops_test_variant": variant}))
    tracker = MlflowTracker.start(experiment, attach_env_run=False)
    tracker.log_hf_model(folder)
    tracker.log_artifact(folder / "deployment_profile.yaml", "deployment_profile") \
        if (folder / "deployment_profile.yaml").exists() else None
    manifest = {"step": 10, "files": {"mp_rank_00_model_states.pt": "0" * 64}, "complete": True}
    tracker.log_dict(manifest, "checkpoints/step-00000010/manifest.json")
    profile = load_profile(folder)
    tags = {Tag.STAGE: "train", Tag.CONFIG_HASH: f"cfg{variant}", Tag.SNAPSHOT_ID: "snap-test",
            Tag.DATA_RUN: data_run_id or data_run(experiment), Tag.IMAGE_TAG: "img:1", Tag.IMAGE_TAG_MUTABLE: "false",
            Tag.GIT_COMMIT: "c0ffee", Tag.GIT_DIRTY: "false", Tag.CODE_VERSION: "0.1.0+pipeline1",
            Tag.BASE_MODEL: "tiny", Tag.BASE_MODEL_ID: "bm-test", Tag.SEED: "1",
            Tag.CHECKPOINT_MANIFEST: f"runs:/{tracker.run_id}/checkpoints/step-00000010/manifest.json",
            Tag.MODEL_ID: model_content_id(folder), Tag.PROFILE_HASH: profile.profile_hash(),
            Tag.PROFILE: profile.to_yaml()}
    if trainer:
        tags[Tag.ACTOR] = trainer
    tracker.set_tags({k: v for k, v in tags.items() if k not in drop})
    tracker.close()
    attest_training_run(tracker.run_id, signer if signer is not None else trainer)
    return tracker.run_id


def attest_training_run(run_id: str, name: str | None) -> dict | None:
    """The training attestation `name` signs over the run's logged model files (what `mlops train run` signs)."""
    from mlops.files import file_manifest
    from mlops.model_refs import materialize
    from registry.entries import digest_of

    if not name:
        return None
    files = file_manifest(materialize(f"runs:/{run_id}/model").hf_dir)
    return attest_as(name, "train", files, {"run_id": run_id}, digest_of(files))


def gate_evidence(model: str, version: str, *, passed: bool = True, champion: tuple[str, str] | None = None,
                  offending: tuple[str, ...] = (), experiment: str = "registry-test",
                  attester: str | None = "alice") -> str:
    """A stored gate report for a version (against `champion` = (version, content id)), and its eval's
    contamination report, as `mlops eval` + `mlops gate` leave them, each attested by `attester` (an identity
    the default policy names for eval and gate evidence). Returns the gate run id."""
    from mlops.model_refs import describe
    from mlops.tracking import MlflowTracker

    desc = describe(f"models:/{model}/{version}")
    ev = MlflowTracker.start(experiment, attach_env_run=False, tags={Tag.STAGE: "eval",
                                                                       Tag.MODEL_KEY: desc.content_id})
    ev.log_dict({"status": "checked", "offending": [{"id": i} for i in offending]}, "eval/contamination.json")
    ev.close()
    who = {"ref": f"models:/{model}/{champion[0]}", "content_id": champion[1]} if champion else None
    report = {"result": "passed" if passed else "failed", "reasons": [] if passed else ["general_knowledge is "
              "inferior"], "settings": {"evidence": {"challenger": {"content_id": desc.content_id,
                                                                    "eval_run_id": ev.run_id}, "champion": who}}}
    gate = MlflowTracker.start(experiment, attach_env_run=False, tags={
        Tag.STAGE: "gate", Tag.MODEL_KEY: desc.content_id, Tag.EVAL_RUN: ev.run_id,
        Tag.GATE_EVAL: report["result"]})
    gate.log_dict(report, "gate/gate_report.json")
    gate.close()
    attest_gate_evidence(model, version, ev.run_id, gate.run_id, report, list(offending), attester)
    return gate.run_id


def attest_gate_evidence(model: str, version: str, eval_run: str, gate_run: str, report: dict, offending: list,
                         attester: str | None) -> None:
    """The eval's and the gate's attestations about the version's registered files, as `attester` signs them."""
    attest_eval_run(model, version, eval_run, {"status": "checked", "offending": [{"id": i} for i in offending]},
                    attester)
    attest_gate_run(model, version, gate_run, eval_run, report, attester)


def attest_eval_run(model: str, version: str, eval_run: str, contamination: dict, attester: str | None,
                    **served) -> dict | None:
    """What `mlops eval` signs (`evaluation.runner.attest_eval`), as `attester`; `gguf=` names the GGUF it served
    (a llama.cpp release form), left out for an hf one."""
    from registry.audit import model_state

    vs = model_state(model).versions[str(version)]
    offending = [str(i.get("id")) for i in contamination.get("offending", [])]
    return attest_as(attester, "eval", vs.evidence["files"], {"eval_run": eval_run, "contamination": {
        "status": contamination.get("status"), "offending": offending}, **served}, vs.evidence["files_digest"])


def attest_gate_run(model: str, version: str, gate_run: str, eval_run: str, report: dict, attester: str | None):
    """What `mlops gate` signs (`evaluation.gate_run.attest_gate`), as `attester`."""
    from registry.audit import model_state
    from registry.entries import digest_of

    vs = model_state(model).versions[str(version)]
    champion = (report.get("settings") or {}).get("evidence", {}).get("champion") or {}
    return attest_as(attester, "gate", vs.evidence["files"], {
        "gate_run": gate_run, "eval_run": eval_run, "result": report["result"], "reasons": report["reasons"],
        "champion": {"ref": champion.get("ref"), "content_id": champion.get("content_id")},
        "report_sha256": digest_of(json.loads(json.dumps(report, default=str)))}, vs.evidence["files_digest"])


PROMOTE_SCRIPT = """
import json, sys
from mlops.errors import AlreadyInForce
from registry.release import promote
from registry.testing import signed_in
from registry.transition import RefusedError
model, version, to, expected = sys.argv[1:5]
expected = None if expected == "-" else expected  # "-": no expectation, each process acts on what it finds
try:
    promote(signed_in("bob"), model, version, to, expect_version=expected)
    print(json.dumps({"version": version, "won": True}))
except AlreadyInForce as err:
    print(json.dumps({"version": version, "won": False, "in_force": True, "why": str(err)[:200]}))
except RefusedError as err:
    print(json.dumps({"version": version, "won": False, "why": str(err)[:200]}))
"""


def race(model: str, versions: list[str], to: str, expected: str = "none", env: dict | None = None) -> list[dict]:
    """Processes started together, each promoting its own version; returns each one's outcome."""
    import os
    import subprocess
    import sys

    full = {**os.environ, **(env or {})}
    procs = [subprocess.Popen([sys.executable, "-c", PROMOTE_SCRIPT, model, v, to, expected], env=full,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for v in versions]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        if proc.returncode != 0 or not stdout.strip():
            raise AssertionError(f"a promoting process failed (exit {proc.returncode}): {stderr[-2000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def release_version(who: dict, model: str, version: str, *, champion: tuple[str, str] | None = None) -> None:
    """Gate evidence, request by tina, approval by alice, promotion to production by bob."""
    from registry.release import decide, promote, request
    from registry.transition import flush_display

    gate_evidence(model, version, champion=champion)
    request(who["tina"], model, version, "production", "ready")
    decide(who["alice"], model, version, "looks good", approve=True)
    promote(who["bob"], model, version, "production")
    flush_display()  # as the CLI and the app do: MLflow's copies have landed when a release is done


def two_versions(hf_dir: Path, *, tmp: Path) -> tuple[dict, list[str], list[str]]:
    """The identities, and model `bot` with two versions registered by tina: (identities, run ids, versions)."""
    from mlops.tracking import init_experiment
    from registry.release import register

    init_experiment("registry-test")
    who = make_identities()
    runs = [training_run(hf_dir, tmp=tmp, variant=variant) for variant in (1, 2)]
    return who, runs, [register(who["tina"], run_id, "bot") for run_id in runs]


def challenger_requested(hf_dir: Path, *, tmp: Path, comment: str) -> dict:
    """v1 in production; v2 with gate evidence against it, requested for production by tina. Returns the
    identities."""
    from registry.audit import model_state
    from registry.release import request

    who, _, _ = two_versions(hf_dir, tmp=tmp)
    release_version(who, "bot", "1")
    gate_evidence("bot", "2", champion=("1", model_state("bot").versions["1"].content_id))
    request(who["tina"], "bot", "2", "production", comment)
    return who


def run_cli(*args: str, env: dict | None = None) -> tuple[int, str, str]:
    """`mlops <args>` in this process, as a user's shell runs it: (exit code, stdout, stderr)."""
    import contextlib
    import io
    import os
    import sys

    from mlops.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.update(env or {})
    sys.argv = ["mlops", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
    return code, out.getvalue(), err.getvalue()


def as_user(name: str) -> dict:
    return {"MLOPS_USER": name, "MLOPS_PASSWORD": PASSWORDS[name]}


class FakeSlot:
    """A serving slot that only remembers which version it was asked to load."""

    current = None

    def load_and_swap(self, hf_dir, profile, version):
        self.current = type("Loaded", (), {"version": version})()


def fake_follower(model: str = "bot", alias: str = "production"):
    """A follower of `model@alias` whose loads only record the version (no files are read)."""
    from registry.follow import Follower

    class Model:
        hf_dir, profile = "x", staticmethod(lambda: None)

    return Follower(model, alias, FakeSlot(), materialize=lambda ref: Model())


def use_store_param(request, monkeypatch) -> str | None:
    """Point a test at the store its fixture parameter names: SQLite (None) or a fresh PostgreSQL database (its
    URL, from the `postgres_url` fixture)."""
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        return url
    return None
