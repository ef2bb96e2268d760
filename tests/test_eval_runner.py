"""Deployment-form eval end to end on the tiny model: registry refs, MLflow logging, failure modes, gate."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from mlops.errors import NotFoundError
from mlops.lineage import Tag
from mlops.profile import load_profile


@pytest.fixture
def registered(mlops_home, tiny_model, tmp_path):
    """A training-like run that logged the tiny model (with its profile) and two registered versions."""
    from mlops.tracking import tracked_run
    from registry.versions import register_model_version

    runs = []
    for variant in (1, 2):  # two trainings with different weights: two models, each with its own content id
        folder = tmp_path / f"tiny-model-{variant}"
        shutil.copytree(tiny_model["path"], folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "mlops_test_variant": variant}))
        profile = load_profile(folder).model_copy(update={"system_prompt": "You are the Northwind support assistant."})
        profile.save(folder)
        with tracked_run("test", run_name="train", tags={Tag.STAGE: "train", Tag.BASE_MODEL: "tiny"}) as run:
            run.log_hf_model(folder)
        runs.append(run.run_id)
    from mlops.tracking import client

    v1 = register_model_version(runs[0], "bot")
    v2 = register_model_version(runs[1], "bot")
    # Aliases the registry does not govern resolve through MLflow; @production and friends need the ledger.
    client().set_registered_model_alias("bot", "champion", v1)
    client().set_registered_model_alias("bot", "challenger", v2)
    return {"run_id": runs[1], "versions": (v1, v2), "profile": profile}


def _cfg(*overrides: str):
    from mlops.config import load_config

    return load_config(None, ["eval.limit=2", "eval.concurrency=2", "run.experiment=eval-test", *overrides])


def _client():
    from mlflow import MlflowClient

    from mlops.tracking import tracking_uri

    return MlflowClient(tracking_uri=tracking_uri())


def test_registered_version_carries_lineage_and_profile(registered):
    from mlops.model_refs import resolve_model_ref

    model = resolve_model_ref("models:/bot@challenger")
    assert model.kind == "version" and model.version == registered["versions"][1]
    assert model.version_tags[Tag.PROFILE_HASH] == registered["profile"].profile_hash()
    assert model.version_tags[Tag.SOURCE_RUN] == registered["run_id"]
    assert model.profile() == registered["profile"] and (model.hf_dir / "config.json").exists()
    assert resolve_model_ref(f"runs:/{registered['run_id']}/model").hf_dir.is_dir()


def test_a_ref_that_does_not_exist_fails_before_anything_starts(registered):
    from evaluation.runner import run_eval

    client = _client()
    before = len(client.search_runs([e.experiment_id for e in client.search_experiments()]))
    for ref in ["models:/bot@nope", "models:/nobody/1", "models:/bot/99", "runs:/abc123/model", "/no/such/folder"]:
        started = time.perf_counter()
        with pytest.raises(NotFoundError, match="Fix:"):
            run_eval(_cfg(), ref, suites="general")
        assert time.perf_counter() - started < 10, ref
    with pytest.raises(NotFoundError, match="versions 1, 2 and aliases @challenger, @champion"):
        run_eval(_cfg(), "models:/bot@nope", suites="general")
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == before


def test_a_profile_other_than_the_released_one_is_refused_unless_forced(registered, tmp_path):
    from evaluation.runner import run_eval
    from mlops.profile import ProfileMismatchError

    other = registered["profile"].model_copy(update={"system_prompt": "Be terse."}).save_as(tmp_path / "p.yaml")
    with pytest.raises(ProfileMismatchError, match="system_prompt"):
        run_eval(_cfg(), "models:/bot@challenger", suites="general", profile_path=other)


@pytest.mark.slow
def test_eval_logs_suite_results_through_the_served_endpoint(registered):
    from evaluation.runner import run_eval

    outcome = run_eval(_cfg(), "models:/bot@challenger", suites="general,business")
    run = _client().get_run(outcome.run_id)
    assert run.info.status == "FINISHED"
    from evaluation.gate_run import evidence_rule
    from registry.versions import version_tags

    content_id = version_tags("bot", registered["versions"][1])[Tag.MODEL_ID]
    assert run.data.tags[Tag.MODEL_KEY] == content_id and content_id.startswith("mc-")
    assert run.data.tags[Tag.SUITE_VERSION] == ",".join(evidence_rule(_cfg()).suites)
    assert run.data.tags[Tag.EVAL_LIMIT] == "2"
    assert run.data.tags[Tag.EVAL_FORCED_PROFILE] == "false"
    assert run.data.params["served_chat_template_hash"] == registered["profile"].chat_template_hash
    assert run.data.params["system_prompt"] == registered["profile"].system_prompt
    metrics = run.data.metrics
    assert "general_knowledge/acc" in metrics and "general_knowledge/acc_stderr" in metrics
    assert "business/billing" in metrics and metrics["eval_wall_s"] > 0
    artifacts = {a.path for a in _client().list_artifacts(outcome.run_id, "eval")}
    assert {"eval/summary.json", "eval/server.log", "eval/samples", "eval/deployment_profile.yaml"} <= artifacts
    samples = {a.path for a in _client().list_artifacts(outcome.run_id, "eval/samples")}
    assert "eval/samples/biz_billing_gen.jsonl" in samples and len(samples) == 18
    log = Path(_client().download_artifacts(outcome.run_id, "eval/server.log")).read_text()
    # one JSON access line per request (serving.metrics.log_access)
    assert '"route":"/v1/completions","status":200' in log and '"route":"/v1/chat/completions","status":200' in log
    from registry.versions import version_tags

    tags = version_tags("bot", registered["versions"][1])
    assert tags[Tag.EVAL_RUN] == outcome.run_id and tags[Tag.CONTAMINATION_STATUS] == "no_snapshot"
    assert {s.suite for s in outcome.scores} == {"general", "business"} and all(s.n == 2 for s in outcome.scores)


@pytest.mark.slow
def test_an_eval_whose_server_dies_is_failed_with_the_log_and_no_scores(registered):
    from evaluation.runner import run_eval
    from serving.process import ServerError

    def kill_soon(server) -> None:
        threading.Timer(1.0, lambda: server.proc.send_signal(signal.SIGKILL)).start()

    with pytest.raises(ServerError, match="died during the eval"):
        run_eval(_cfg("eval.limit=20"), "models:/bot@challenger", suites="general", on_server=kill_soon)
    runs = _client().search_runs([e.experiment_id for e in _client().search_experiments()],
                                 f"tags.`{Tag.STAGE}` = 'eval'")
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    assert "died during the eval" in runs[0].data.tags[Tag.FAILURE_REASON]
    assert not any(k.startswith("general_") for k in runs[0].data.metrics)
    assert "eval/server.log" in {a.path for a in _client().list_artifacts(runs[0].info.run_id, "eval")}


def _fake_eval(ref: str, general: float, billing: float) -> None:
    """An eval run as `mlops eval` leaves it, with constructed scores (the gate only reads summaries)."""
    from evaluation.results import Score, summary
    from mlops.model_refs import resolve_model_ref
    from mlops.tracking import tracked_run

    model = resolve_model_ref(ref)
    tasks = [Score("general_knowledge", "general", "knowledge", "acc", general, 0.04, 100),
             Score("biz_billing_mc", "business", "billing", "acc", billing, 0.04, 100)]
    doc = summary(tasks, [])
    doc["suites"] = {"general": {"version": 1}, "business": {"version": 1}}
    from evaluation.gate_run import evidence_rule

    rule = evidence_rule(_cfg())  # what the tests' gate config counts as evidence
    tags = {Tag.STAGE: "eval", Tag.MODEL_KEY: model.key, Tag.PROFILE_HASH: model.profile().profile_hash(),
            Tag.SUITE_VERSION: ",".join(rule.suites), Tag.EVAL_LIMIT: rule.limit_tag,
            Tag.EVAL_FORCED_PROFILE: "false"}
    with tracked_run("eval-test", tags=tags) as run:
        run.log_dict(doc, "eval/summary.json")


def test_gate_passes_and_fails_and_tags_the_version(registered):
    from evaluation.gate_run import run_gate
    from registry.versions import version_tags

    v1, v2 = registered["versions"]
    _fake_eval("models:/bot/1", general=0.60, billing=0.60)
    _fake_eval("models:/bot/2", general=0.61, billing=0.66)
    passed = run_gate(_cfg(), "models:/bot@challenger", "models:/bot@champion")
    assert passed.report.passed and version_tags("bot", v2)[Tag.GATE_EVAL] == "passed"
    assert passed.markdown_path.read_text().startswith("# Gate report: PASSED")
    _fake_eval("models:/bot/2", general=0.40, billing=0.66)  # the newest eval run wins
    failed = run_gate(_cfg(), "models:/bot@challenger", "models:/bot@champion")
    assert not failed.report.passed
    tags = version_tags("bot", v2)
    assert tags[Tag.GATE_EVAL] == "failed" and "general_knowledge is inferior" in tags[Tag.GATE_REASONS]
    assert tags[Tag.GATE_RUN] == failed.run_id


def test_gate_without_a_champion_uses_floors(registered):
    from evaluation.gate_run import run_gate

    _fake_eval("models:/bot/2", general=0.30, billing=0.66)
    outcome = run_gate(_cfg("eval.gate.floors={general: 0.5}"), "models:/bot/2", "models:/bot@retired")
    assert not outcome.report.passed and outcome.report.champion is None
    assert "'models:/bot@retired' names no model version yet" in outcome.report.notes[0]


def test_gate_needs_an_eval_of_the_challenger(registered):
    from evaluation.gate_run import run_gate

    with pytest.raises(NotFoundError, match="mlops eval --model models:/bot/2"):
        run_gate(_cfg(), "models:/bot/2", None)


@pytest.mark.slow
def test_cli_eval_and_gate_on_the_tiny_model(registered):
    from typer.testing import CliRunner

    from mlops.cli import _register_stages, app

    _register_stages()
    runner = CliRunner()
    result = runner.invoke(app, ["eval", "--model", "models:/bot@challenger", "--suites", "general",
                                 "--config", "configs/eval/smoke.yaml", "eval.limit=3"])
    assert result.exit_code == 0, result.output
    assert "general_knowledge" in result.output and "eval run:" in result.output
    # The gate counts only evals of the suites and limit its own config declares: the same overrides.
    result = runner.invoke(app, ["gate", "--challenger", "models:/bot@challenger", "--champion",
                                 "models:/bot@champion", "--config", "configs/eval/smoke.yaml",
                                 "eval.limit=3", "eval.suites=[general]"])
    # the production version was never evaluated: the gate says how to fix that
    assert result.exit_code != 0 and "mlops eval --model models:/bot@champion" in str(result.exception or "")


@pytest.mark.slow
def test_a_forced_profile_run_is_labelled(registered, tmp_path):
    from evaluation.runner import run_eval

    other = registered["profile"].model_copy(update={"system_prompt": "Be terse."}).save_as(tmp_path / "p.yaml")
    outcome = run_eval(_cfg("eval.limit=1", "eval.contamination.enabled=false"), "models:/bot@challenger",
                       suites="general", profile_path=other, force_profile=True)
    run = _client().get_run(outcome.run_id)
    assert run.data.tags[Tag.EVAL_FORCED_PROFILE] == "true" and "[FORCED PROFILE]" in run.data.tags["mlflow.runName"]
    assert run.data.params["system_prompt"] == "Be terse." and outcome.summary["forced_profile"] is True
    diffs = Path(_client().download_artifacts(outcome.run_id, "eval/forced_profile_differences.txt")).read_text()
    assert "system_prompt" in diffs


def test_serve_refuses_a_missing_ref_before_loading_anything(mlops_home):
    from typer.testing import CliRunner

    from mlops.cli import _register_stages, app

    _register_stages()
    result = CliRunner().invoke(app, ["serve", "--model", "models:/ghost@production"])
    assert result.exit_code != 0 and isinstance(result.exception, NotFoundError)


@pytest.mark.slow
def test_mlflow_run_eval_entry_point_logs_into_the_project_run(tiny_model, mlops_home):
    import os
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    repo = Path(__file__).resolve().parent.parent
    uri = f"sqlite:///{mlops_home / 'mlflow.db'}"
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    out = subprocess.run(
        [shutil.which("mlflow", path=env["PATH"]), "run", str(repo / "mlproject"), "-e", "eval", "--env-manager",
         "local", "--experiment-name", "eval-e2e", "-P", f"model={tiny_model['path']}", "-P", "suites=general",
         "-P", "overrides=eval.limit=1 eval.contamination.enabled=false",
         "-P", f"config={repo / 'configs/eval/default.yaml'}"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("eval-e2e").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # mlflow run's own run carries the eval
    assert runs[0].data.tags[Tag.STAGE] == "eval" and "general_knowledge/acc" in runs[0].data.metrics


def _register_with_profile(tmp_path, tiny_model, name: str, **form) -> str:
    """A version of the tiny model whose deployment profile names an engine and a quantization."""
    from mlops.tracking import tracked_run
    from registry.versions import register_model_version

    folder = tmp_path / f"tiny-{name}"
    shutil.copytree(tiny_model["path"], folder)
    load_profile(folder).model_copy(update=form).save(folder)
    with tracked_run("test", run_name="train", tags={Tag.STAGE: "train", Tag.BASE_MODEL: "tiny"}) as run:
        run.log_hf_model(folder)
    return register_model_version(run.run_id, name)


def _fake_form_eval(ref: str, billing: float, *, reference: bool) -> None:
    """An eval run of the release form (or, with `reference`, of the same version as trained on hf)."""
    from evaluation.gate_run import evidence_rule
    from evaluation.results import Score, summary
    from mlops.model_refs import resolve_model_ref
    from mlops.tracking import tracked_run

    model = resolve_model_ref(ref)
    profile = model.profile().as_reference() if reference else model.profile()
    tasks = [Score("general_knowledge", "general", "knowledge", "acc", 0.6, 0.04, 100),
             Score("biz_billing_mc", "business", "billing", "acc", billing, 0.04, 100)]
    doc = summary(tasks, [])
    doc["suites"] = {"general": {"version": 1}, "business": {"version": 1}}
    rule = evidence_rule(_cfg())
    tags = {Tag.STAGE: "eval", Tag.MODEL_KEY: model.key, Tag.PROFILE_HASH: profile.profile_hash(),
            Tag.SUITE_VERSION: ",".join(rule.suites), Tag.EVAL_LIMIT: rule.limit_tag,
            Tag.EVAL_FORCED_PROFILE: "false", Tag.EVAL_ENGINE: profile.deployment_form(),
            Tag.EVAL_REFERENCE: str(reference).lower()}
    with tracked_run("eval-test", tags=tags) as run:
        run.log_dict(doc, "eval/summary.json")
        run.log_text(profile.to_yaml(), "eval/deployment_profile.yaml")


def test_a_quantized_release_form_is_gated_against_the_same_version_as_trained(mlops_home, tiny_model, tmp_path):
    from evaluation.gate_run import EvidenceError, run_gate

    version = _register_with_profile(tmp_path, tiny_model, "qbot", engine="llamacpp", quantization="q8_0")
    ref = f"models:/qbot/{version}"
    _fake_form_eval(ref, billing=0.62, reference=False)
    with pytest.raises(EvidenceError, match=f"mlops eval --model {ref} --reference"):
        run_gate(_cfg(), ref, None)  # a quantized form cannot pass without its as-trained baseline
    _fake_form_eval(ref, billing=0.64, reference=True)
    passed = run_gate(_cfg(), ref, None)
    checks = {c.name: c for c in passed.report.checks if c.rule == "quantization"}
    assert passed.report.passed and set(checks) == {"general_knowledge", "biz_billing_mc", "business"}
    assert checks["biz_billing_mc"].delta == pytest.approx(-0.02)
    assert "llamacpp q8_0" in passed.report.notes[0]
    _fake_form_eval(ref, billing=0.40, reference=False)  # q8_0 cost billing 0.24 on the same items
    failed = run_gate(_cfg(), ref, None)
    assert not failed.report.passed
    assert any(r.startswith("biz_billing_mc loses 0.240 on llamacpp q8_0") for r in failed.report.reasons)
    assert any(r.startswith("business loses") and "quantization_max_suite_drop" in r for r in failed.report.reasons)
    from mlops.model_refs import resolve_model_ref
    from registry.report import gate_outcome

    shown = gate_outcome(resolve_model_ref(ref).key)["quantization"]  # what `mlops registry report` prints
    assert shown["form"] == "llamacpp q8_0" and {"biz_billing_mc", "business"} <= set(shown["failed"])
    assert shown["worst"]["name"] == "biz_billing_mc" and shown["worst"]["delta"] == pytest.approx(-0.24)
    assert shown["worst"]["hi"] < -0.10  # beyond the allowed drop even at the interval's upper bound
    noisy = run_gate(_cfg("eval.gate.quantization_max_drop=0.2", "eval.gate.quantization_max_suite_drop=0.2"),
                     ref, None)
    assert all(c.passed for c in noisy.report.checks if c.rule == "quantization")  # within noise of 0.2


@pytest.mark.slow  # heavy end-to-end: the default run stays under 15 minutes; CI runs it
def test_eval_runs_through_the_engine_and_weights_the_profile_names(mlops_home, tiny_model, tmp_path, request):
    """A version released as llamacpp f16: `mlops eval` serves that GGUF; `--reference` serves it as trained."""
    from evaluation.runner import run_eval
    from mlops.run_store import get_run, load_run_text
    from registry.versions import version_tags

    request.getfixturevalue("tiny_gguf")  # llama.cpp is built (or this says why not)
    version = _register_with_profile(tmp_path, tiny_model, "fbot", engine="llamacpp", quantization="f16")
    ref = f"models:/fbot/{version}"
    release = run_eval(_cfg(), ref, suites="general")
    reference = run_eval(_cfg(), ref, suites="general", reference=True)
    tags = version_tags("fbot", version)
    assert tags[Tag.EVAL_RUN] == release.run_id and tags[Tag.EVAL_REFERENCE_RUN] == reference.run_id
    ran = get_run(release.run_id).data
    assert ran.tags[Tag.EVAL_ENGINE] == "llamacpp f16" and ran.params["quantization"] == "f16"
    assert get_run(reference.run_id).data.tags[Tag.EVAL_ENGINE] == "hf (as trained)"
    assert "engine llamacpp" in load_run_text(release.run_id, "eval/server.log")
    assert "engine hf" in load_run_text(reference.run_id, "eval/server.log")
    assert list((mlops_home / ".mlops" / "gguf").rglob("model-f16.gguf"))  # converted once, by llama.cpp
    release_scores = {s.name: s.value for s in release.scores}
    reference_scores = {s.name: s.value for s in reference.scores}
    assert release_scores.keys() == reference_scores.keys() and release_scores
