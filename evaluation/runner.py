"""Deployment-form eval: serve the model version under its profile, run lm-eval through the endpoint, log it.

Loglikelihood (multiple-choice) tasks go through `/v1/completions` as token-id requests (`local-completions`,
chat template + system prompt rendered client-side with the model's own tokenizer); generation tasks go
through `/v1/chat/completions` (`local-chat-completions`), where the server applies the template, the system
prompt, the stop strings and the sampling defaults of the profile. Scores are logged only when every suite
finished; a server that dies mid-run fails the run with its log attached.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evaluation.results import Score, metrics_for_tracking, summary, task_scores, write_samples
from evaluation.suites import Suite, get_suites, task_config
from mlops.lineage import Tag
from mlops.profile import DeploymentProfile, check_template, choose_eval_profile, read_profile
from serving.process import ServerProcess


@dataclass(frozen=True)
class EvalOutcome:
    run_id: str
    model_key: str
    scores: list[Score]
    summary: dict
    wall_s: float
    contamination: dict | None = None


def prepare_tasks(suites: list[Suite]) -> tuple[list, list]:
    """lm-eval task objects (multiple-choice, generation), built while the server loads the model."""
    from lm_eval.tasks import TaskManager, get_task_dict

    manager = TaskManager(include_defaults=False)
    mc = [task_config(s, t) for s in suites for t in s.tasks if t.kind == "multiple_choice"]
    gen = [task_config(s, t) for s in suites for t in s.tasks if t.kind == "generate"]
    return (list(get_task_dict(mc, manager).values()) if mc else [],
            list(get_task_dict(gen, manager).values()) if gen else [])


def _rendered(task) -> bool:
    return bool((getattr(task, "config", None) and task.config.metadata or {}).get("rendered"))


def _lm_eval(server: ServerProcess, hf_dir: Path, name: str, profile: DeploymentProfile, suites: list[Suite],
             eval_cfg, cache_dir: Path | None, seed: int, tasks: tuple[list, list] | None = None) -> dict:
    """Run lm-eval in-process against the server; returns the merged lm-eval result dict."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    common = {"model": name, "header": server.headers, "max_length": server.max_model_len(),
              "num_concurrent": eval_cfg.concurrency,
              "timeout": eval_cfg.request_timeout, "max_retries": 3, "seed": profile.sampling.seed or seed,
              "trust_remote_code": False}  # lm-eval loads the tokenizer from the folder in this process
    mc, gen = tasks or prepare_tasks(suites)
    options = {"task_manager": TaskManager(include_defaults=False), "limit": eval_cfg.limit, "log_samples": True,
               "bootstrap_iters": eval_cfg.bootstrap_iters, "random_seed": seed, "numpy_random_seed": seed,
               "torch_random_seed": seed, "fewshot_random_seed": seed}
    merged: dict = {"results": {}, "samples": {}, "n-samples": {}, "configs": {}, "versions": {}}
    # Tasks whose prompts were rendered as trained (held-out preference pairs) are never rendered again.
    rendered = [t for t in mc if _rendered(t)]
    for group, chat in ((([t for t in mc if not _rendered(t)]), eval_cfg.chat_template_mc), (rendered, False)):
        if not group:
            continue
        result = simple_evaluate(
            model="local-completions",
            model_args={**common, "base_url": f"{server.url}/v1/completions", "tokenizer": str(hf_dir),
                        "tokenizer_backend": "huggingface", "tokenized_requests": True,
                        "batch_size": eval_cfg.batch_size},
            tasks=group, apply_chat_template=chat, system_instruction=profile.system_prompt if chat else None,
            use_cache=str(cache_dir / ("rendered" if group is rendered else "loglikelihood")) if cache_dir else None,
            **options,
        )
        _merge(merged, result)
        server.check_alive()
    if gen:
        sampling = profile.sampling
        gen_kwargs = {"temperature": sampling.temperature, **({"top_p": sampling.top_p} if sampling.top_p < 1 else {})}
        result = simple_evaluate(
            model="local-chat-completions",
            model_args={**common, "base_url": f"{server.url}/v1/chat/completions",
                        "max_gen_toks": sampling.max_tokens},
            tasks=gen, apply_chat_template=True, gen_kwargs=gen_kwargs,
            use_cache=str(cache_dir / "generate") if cache_dir else None, **options,
        )
        _merge(merged, result)
        server.check_alive()
    return merged


def _merge(merged: dict, result: dict | None) -> None:
    if result is None:
        raise RuntimeError("lm-eval returned no results")
    for key in merged:
        merged[key].update(result.get(key) or {})


def run_eval(cfg, ref: str, *, suites: list[str] | str | None = None, profile_path: Path | None = None,
             force_profile: bool = False, on_server: Callable[[ServerProcess], None] | None = None,
             attach_env_run: bool = True, reference: bool = False) -> EvalOutcome:
    """Evaluate a model ref in deployment form and log it to an MLflow run linked to the model version.

    Under `mlflow run -e eval` the eval logs into the project's run (MLFLOW_RUN_ID); a caller that runs an eval
    inside another stage's `mlflow run` (a sweep objective) passes `attach_env_run=False` to get a run of its own.
    `reference=True` judges the version's reference form instead (its profile on `hf`, weights as trained): the
    baseline the quantization gate holds the release form to, recorded on the version as such.
    """
    from evaluation.gate_run import limit_tag
    from mlops.config import config_hash, require_section, resolved_yaml
    from mlops.lineage import collect_lineage, enforce_release
    from mlops.model_refs import resolve_model_ref, set_version_tags
    from mlops.paths import mlops_dir
    from mlops.tracking import tracked_run

    eval_cfg = require_section(cfg, "eval")
    model = resolve_model_ref(ref)  # fails before anything starts
    suite_objs = get_suites(suites or eval_cfg.suites, eval_cfg.suite_paths)
    released = model.profile()
    proposed = read_profile(profile_path) if profile_path else None
    profile, diffs = choose_eval_profile(released, proposed, force=force_profile)
    if reference:
        profile = profile.as_reference()
    reference = reference or (profile == released.as_reference() and profile != released)
    template_problem = check_template(profile, model.hf_dir)
    if template_problem and not force_profile:
        from mlops.profile import ProfileMismatchError

        raise ProfileMismatchError(
            f"{template_problem}: the model would be served with another template than its profile names. "
            "Fix: store a profile made for this tokenizer with the model, or pass --force-profile (labelled)."
        )
    forced = bool(diffs or template_problem)
    labels = sorted({s.label for s in suite_objs})
    lineage = collect_lineage(
        config_hash(cfg), cfg.run.seed,
        base_model=model.run_tags.get(Tag.BASE_MODEL), base_model_id=model.run_tags.get(Tag.BASE_MODEL_ID),
        snapshot_id=model.snapshot_id,
        extra={Tag.STAGE: "eval", Tag.MODEL_REF: ref, Tag.MODEL_KEY: model.key, Tag.SOURCE_RUN: model.run_id,
               Tag.PROFILE_HASH: profile.profile_hash(), Tag.SUITE_VERSION: ",".join(labels),
               Tag.EVAL_FORCED_PROFILE: str(forced).lower(), Tag.RELEASE: str(cfg.run.release).lower(),
               Tag.EVAL_LIMIT: limit_tag(eval_cfg.limit), Tag.EVAL_ENGINE: profile.deployment_form(),
               Tag.EVAL_REFERENCE: str(reference).lower()},
    )
    enforce_release(lineage, cfg.run.release)
    work = mlops_dir() / "eval" / f"{model.key}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6}"
    work.mkdir(parents=True, exist_ok=True)
    profile_file = profile.save_as(work / "deployment_profile.yaml")
    cache_dir = mlops_dir() / "eval-cache" / model.key / profile.profile_hash() if eval_cfg.use_cache else None
    run_name = cfg.run.run_name or f"eval {model.served_name} on {profile.deployment_form()}" + (
        " [FORCED PROFILE]" if forced else "") + (" [reference]" if reference else "")
    tags = {k: v for k, v in lineage.as_tags().items() if v not in (None, "None")}
    with tracked_run(cfg.run.experiment, run_name=run_name, tags=tags, attach_env_run=attach_env_run) as run:
        started = time.perf_counter()
        run.log_text(resolved_yaml(cfg), "config/resolved.yaml")
        run.log_text(profile.to_yaml(), "eval/deployment_profile.yaml")
        if diffs:
            run.log_text("\n".join(diffs), "eval/forced_profile_differences.txt")
        run.log_params({
            "model_ref": ref, "model_key": model.key, "suites": ",".join(labels), "limit": eval_cfg.limit,
            "served_chat_template_hash": profile.chat_template_hash, "system_prompt": profile.system_prompt,
            "temperature": profile.sampling.temperature, "top_p": profile.sampling.top_p,
            "max_tokens": profile.sampling.max_tokens, "sampling_seed": profile.sampling.seed,
            "max_context": profile.max_context, "stop": json.dumps(profile.stop), "profile_hash": profile.profile_hash(),
            "engine": profile.engine, "quantization": profile.quantization or "none",
            **{f"suite.{s.name}.version": s.version for s in suite_objs},
            **{f"suite.{s.name}.fingerprint": s.fingerprint[:16] for s in suite_objs},
        })
        contamination = None
        if eval_cfg.contamination.enabled:  # first: a contaminated candidate is refused whatever it scores
            from evaluation.contamination import contamination_for_model

            contamination = contamination_for_model(model, suite_objs, eval_cfg.contamination)
            run.log_dict(contamination, "eval/contamination.json")
            run.set_tags(contamination_tags(contamination))
            set_version_tags(model, contamination_tags(contamination))
        facts = {"model_ref": ref, "model_key": model.key, "profile_hash": profile.profile_hash(),
                 "forced_profile": forced, "run_id": run.run_id, **contamination_brief(contamination)}
        stop = not_scored_because(contamination, eval_cfg.contamination, released=released_version(model))
        if stop:  # nothing served: the report is all a refused candidate's eval needs
            scores, doc = [], summary([], suite_objs, {**facts, "not_scored": stop})
            run.set_tags({Tag.EVAL_NOT_SCORED: "contaminated"})
            print(f"eval not scored: {stop}", flush=True)
        else:
            results, served_s = _serve_and_score(model, profile, profile_file, forced, suite_objs, eval_cfg, cfg,
                                                 cache_dir, work, on_server, run)
            scores = task_scores(results, suite_objs)
            doc = summary(scores, suite_objs, facts)
            run.log_metrics({**metrics_for_tracking(results, suite_objs, scores), "eval_lm_eval_s": served_s}, step=0)
            for path in write_samples(results, work / "samples"):
                run.log_artifact(path, "eval/samples")
            run.log_dict({k: results[k] for k in ("results", "n-samples", "versions")}, "eval/lm_eval_results.json")
        wall = time.perf_counter() - started
        run.log_metrics({"eval_wall_s": wall}, step=0)
        run.log_dict(doc, "eval/summary.json")
        if not forced:  # a forced-profile eval is labelled, never recorded as the version's evidence
            set_version_tags(model, {Tag.EVAL_REFERENCE_RUN if reference else Tag.EVAL_RUN: run.run_id})
    if not forced:
        attest_eval(model, run.run_id, doc, contamination, reference=reference, profile=profile)
    return EvalOutcome(run.run_id, model.key, scores, doc, wall, contamination)


def _serve_and_score(model, profile, profile_file: Path, forced: bool, suite_objs: list[Suite], eval_cfg, cfg,
                     cache_dir: Path | None, work: Path, on_server, run) -> tuple[dict, float]:
    """Serve the model under its profile and run lm-eval through the endpoint: (results, seconds served)."""
    server = ServerProcess(model.hf_dir, profile_file, model.served_name, work / "server.log",
                           force_profile=forced, threads=eval_cfg.server_threads or os.cpu_count())
    try:
        with server:
            server.launch()
            tasks = prepare_tasks(suite_objs)  # overlaps the server's model load
            server.wait_healthy(eval_cfg.server_start_timeout)
            served_at = time.perf_counter()
            if on_server:
                on_server(server)
            results = _lm_eval(server, model.hf_dir, model.served_name, profile, suite_objs, eval_cfg,
                               cache_dir, cfg.run.seed, tasks)
    except BaseException as err:
        run.log_artifact(server.log_path, "eval")
        if not server.alive() and not isinstance(err, KeyboardInterrupt):
            from serving.process import ServerError

            if isinstance(err, ServerError):
                raise
            raise ServerError(
                f"the model server died during the eval ({type(err).__name__}: {str(err)[:300]}); "
                f"no scores were recorded. Its log ends with:\n{server.log_tail()}"
            ) from err
        raise
    run.log_artifact(server.log_path, "eval")
    return results, time.perf_counter() - served_at


def contamination_brief(report: dict | None) -> dict:
    """What the eval's summary says of its contamination report (the gate reads it from there)."""
    if report is None:
        return {}
    return {"contamination": {"status": report["status"], "count": report.get("count"),
                              "snapshot_id": report.get("snapshot_id")}}


def released_version(model) -> bool:
    """Whether the model is a version a release act put behind a serving alias (a champion, e.g. @production)."""
    from registry.state import ALIAS_OF_STAGE

    return bool(set(model.aliases or ()) & set(ALIAS_OF_STAGE.values()))


def not_scored_because(report: dict | None, rule, *, released: bool = False) -> str | None:
    """Why the suites are not scored (eval.contamination.when_found=stop and an item overlaps the snapshot). A
    released version is scored all the same: the contamination gate judges candidates, and a champion's eval is
    the baseline every later gate compares with (a DPO round's held-out pairs come from the champion's own
    traffic, which repeats what it was trained on); its report stays in the summary and on its tags."""
    if report is None or rule.when_found != "stop" or report.get("status") != "checked" or not report.get("count"):
        return None
    if released:
        print(f"eval scored although {report['count']} eval items overlap the training snapshot "
              f"{report.get('snapshot_id')}: this version is released, its scores are a baseline", flush=True)
        return None
    return (f"{report['count']} eval items overlap the training snapshot {report.get('snapshot_id')} (e.g. "
            f"{', '.join(str(i.get('id')) for i in report.get('offending', [])[:3])}): the contamination gate "
            "refuses this model whatever it scores, so it was not served. Set eval.contamination.when_found=score "
            "to score it anyway")


def attest_eval(model, run_id: str, doc: dict, contamination: dict | None, *, reference: bool,
                profile=None) -> str | None:
    """Whoever ran the eval signs its scores and contamination report about the version's registered files, and
    the GGUF it served (the signed package in force, which the engine loads and checks; none: a local conversion
    or an hf form): an approval fixes exactly that artifact for serving."""
    from registry.attest_store import attest_version, signed_in
    from registry.entries import digest_of

    offending = [str(i.get("id")) for i in (contamination or {}).get("offending", [])]
    predicate = {"eval_run": run_id, "model_key": model.key, "summary_sha256": digest_of(doc),
                 "contamination": {"status": (contamination or {}).get("status", "not_run"), "offending": offending},
                 "report_sha256": digest_of(contamination) if contamination is not None else None,
                 # unsigned or not served (a contaminated model's eval stops first): no GGUF to fix
                 "gguf": served_gguf(model, profile) if signed_in() and not doc.get("not_scored") else None}
    return attest_version("eval_reference" if reference else "eval", getattr(model, "name", None),
                          getattr(model, "version", None), predicate)


def served_gguf(model, profile) -> dict | None:
    """{sha256, quantization} of the packaged GGUF a llama.cpp release form serves; None for any other form."""
    if profile is None or profile.engine != "llamacpp" or not profile.quantization:
        return None
    from registry.integrity import packaged_gguf

    record = packaged_gguf(model.key, profile.quantization)  # what the engine loads, and checks on every load
    return {"sha256": record["sha256"], "quantization": profile.quantization} if record else None


def contamination_tags(report: dict) -> dict[str, str]:
    offending = [item["id"] for item in report.get("offending", [])]
    return {
        Tag.CONTAMINATION_STATUS: report["status"],
        Tag.CONTAMINATION_COUNT: str(len(offending)) if report["status"] == "checked" else "unknown",
        Tag.CONTAMINATION_ITEMS: ",".join(offending)[:4000] if offending else "",
    }
