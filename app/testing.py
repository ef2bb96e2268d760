"""Test and demo support for the approval app: a release history with real stored evidence, built quickly.

Versions are real registered versions (`registry.testing.training_run` + `registry.release.register`); their
eval runs store what `mlops eval` stores (`eval/summary.json` over the real suites' items, `eval/samples/<task>.jsonl`
in lm-eval's sample shape, `eval/contamination.json`), and their gate runs store a report computed by the real
gate (`evaluation.gate.compare`) from those summaries. Only the model calls are skipped: each item's outcome is
drawn deterministically from (task, item, version).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from mlops.lineage import Tag

EXPERIMENT = "app-test"
LIMIT = 8  # items per task


def _u(*parts) -> float:
    """A deterministic number in [0, 1) from its parts."""
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:8], 16) / 16**8


def outcome(task: str, index: int, improve: float, regress: float, salt: str) -> bool:
    """Whether a version answers an item correctly: a shared baseline, then its own fixes and breakages."""
    base = _u(task, index, "baseline") < 0.55
    if base:
        return _u(task, index, salt, "regress") >= regress
    return _u(task, index, salt, "improve") < improve


def _sample(task, index: int, item: dict, correct: bool) -> dict:
    prompt = task.template.replace("{{prompt}}", str(item.get("prompt", "")))
    if task.kind == "multiple_choice":
        choices = list(item["choices"])
        picked = item["answer"] if correct else (item["answer"] + 1) % len(choices)
        return {"doc_id": index, "item_id": item.get("id"), "target": item["answer"],
                "arguments": [[prompt, f" {c}"] for c in choices],
                "response": [[-0.5 if i == picked else -2.0 - i, i == picked] for i in range(len(choices))],
                "metrics": {task.primary: float(correct)}}
    target = str(item.get("target", ""))
    answer = target if correct else f"I am not sure, maybe {target[::-1]}"
    return {"doc_id": index, "item_id": item.get("id"), "target": target,
            "arguments": [[prompt, {"until": ["\n"], "max_gen_toks": task.max_gen_toks}]],
            "response": [answer], "metrics": {task.primary: 1.0 if correct else 0.1}}


def eval_run(model: str, version: str, *, improve: float = 0.0, regress: float = 0.0, offending: tuple = (),
             suites: str = "general,business", limit: int = LIMIT, experiment: str = EXPERIMENT,
             attester: str | None = "alice") -> str:
    """An eval run of a version as `mlops eval` stores it, attested by `attester`; returns its run id."""
    import json

    from evaluation.results import Score, summary
    from evaluation.suites import get_suites
    from mlops.model_refs import describe, set_version_tags
    from mlops.tracking import MlflowTracker
    from registry.testing import attest_eval_run

    desc = describe(f"models:/{model}/{version}")
    suite_objs = get_suites(suites)
    scores, samples = [], {}
    for suite in suite_objs:
        for task in suite.tasks:
            rows = [_sample(task, i, item, outcome(task.name, i, improve, regress, f"{model}/{version}"))
                    for i, item in enumerate(task.items()[:limit])]
            samples[task.name] = rows
            n = len(rows)
            value = sum(r["metrics"][task.primary] for r in rows) / max(1, n)
            stderr = math.sqrt(max(value * (1 - value), 1e-4) / max(1, n - 1))
            scores.append(Score(task.name, suite.name, task.area, task.primary, value, stderr, n))
    labels = sorted(s.label for s in suite_objs)
    tracker = MlflowTracker.start(experiment, attach_env_run=False, run_name=f"eval {model}/{version}", tags={
        Tag.STAGE: "eval", Tag.MODEL_KEY: desc.content_id, Tag.MODEL_REF: desc.ref, Tag.SOURCE_RUN: desc.run_id,
        Tag.PROFILE_HASH: desc.profile_hash, Tag.SUITE_VERSION: ",".join(labels), Tag.EVAL_LIMIT: str(limit),
        Tag.EVAL_FORCED_PROFILE: "false"})
    doc = summary(scores, suite_objs, {"model_ref": desc.ref, "model_key": desc.content_id,
                                       "run_id": tracker.run_id})
    tracker.log_dict(doc, "eval/summary.json")
    for task, rows in samples.items():
        tracker.log_text("\n".join(json.dumps(r) for r in rows) + "\n", f"eval/samples/{task}.jsonl")
    contamination = {"status": "checked", "ngram": 8, "min_ratio": 0.0, "items_checked": len(scores) * limit,
                     "count": len(offending), "offending": [{"id": i, "suite": "business", "task": "biz_refunds_"
                                                             "returns_mc", "ratio": 0.5, "prompt": "How many days"}
                                                            for i in offending]}
    tracker.log_dict(contamination, "eval/contamination.json")
    tracker.close()
    set_version_tags(desc, {Tag.EVAL_RUN: tracker.run_id})
    attest_eval_run(model, version, tracker.run_id, contamination, attester)  # as `mlops eval` signed in signs it
    return tracker.run_id


def gate_run(model: str, version: str, eval_run_id: str, *, champion: tuple[str, str] | None = None,
             experiment: str = EXPERIMENT, attester: str | None = "alice") -> str:
    """A gate run as `mlops gate` stores it: the real comparison of the two stored summaries. `champion` is
    (version, its eval run id). Returns the gate run id."""
    from evaluation.config import GateConfig
    from evaluation.gate import compare
    from mlops.model_refs import describe, set_version_tags
    from mlops.run_store import load_run_json
    from mlops.tracking import MlflowTracker
    from registry.testing import attest_gate_run

    mine = describe(f"models:/{model}/{version}")
    theirs = describe(f"models:/{model}/{champion[0]}") if champion else None
    report = compare(load_run_json(eval_run_id, "eval/summary.json"),
                     load_run_json(champion[1], "eval/summary.json") if champion else None, GateConfig(),
                     challenger_label=mine.ref, champion_label=theirs.ref if theirs else "none")

    def who(d, run: str) -> dict:
        return {"ref": d.ref, "name": d.name, "version": d.version, "content_id": d.content_id, "eval_run_id": run}

    report.settings["evidence"] = {"challenger": who(mine, eval_run_id),
                                   "champion": who(theirs, champion[1]) if champion else None, "history": [],
                                   "suites": [], "limit": str(LIMIT)}
    result = report.as_dict()
    tracker = MlflowTracker.start(experiment, attach_env_run=False, run_name=f"gate {model}/{version}", tags={
        Tag.STAGE: "gate", Tag.MODEL_KEY: mine.content_id, Tag.MODEL_REF: mine.ref, Tag.EVAL_RUN: eval_run_id,
        Tag.GATE_EVAL: result["result"]})
    tracker.log_dict(result, "gate/gate_report.json")
    tracker.close()
    attest_gate_run(model, version, tracker.run_id, eval_run_id, result, attester)
    set_version_tags(mine, {Tag.GATE_EVAL: result["result"], Tag.GATE_RUN: tracker.run_id,
                            Tag.GATE_REASONS: "; ".join(result["reasons"])[:4000] or "all checks passed"})
    return tracker.run_id


def training_history(run_id: str, *, seed: int, steps: int = 40, extra_tags: dict | None = None,
                     experiment: str = EXPERIMENT) -> None:
    """Loss, validation loss and throughput curves and a resolved config on a finished training run."""
    from mlops.tracking import MlflowTracker

    tracker = MlflowTracker.start(experiment, resume_run_id=run_id, attach_env_run=False)
    for step in range(1, steps + 1):
        loss = 2.4 * math.exp(-step / (10 + seed)) + 0.55 + 0.04 * (_u(seed, step) - 0.5)
        metrics = {"loss": loss, "tokens_per_s": 5200 + 400 * seed + 300 * (_u(seed, step, "t") - 0.5)}
        if step % 10 == 0:
            metrics["val_loss"] = loss + 0.08
        tracker.log_metrics(metrics, step=step)
    tracker.log_text(f"run:\n  seed: 1\ntrain:\n  lr: {1e-4 * seed:g}\n  steps: {steps}\n", "config/resolved.yaml")
    if extra_tags:
        tracker.set_tags(extra_tags)
    tracker.close()


def seed_release(hf_dir: Path, tmp: Path, model: str = "bot") -> dict:
    """Identities and a release history of `model`:

    - v1: released to production (requested by tina, approved by alice, promoted by bob);
    - v2: better than v1, gate passed, requested by tina: alice or bob may approve it;
    - v3: gate passed, trained by tina but requested by alice: alice may not approve it (four-eyes), and it came
      from a sweep trial;
    - v4: regressed, gate failed against v1, requested by tina: nobody may approve it without an override.
    """
    from mlops.tracking import init_experiment
    from registry.release import decide, promote, register, request
    from registry.testing import data_run, make_identities, training_run

    init_experiment(EXPERIMENT)
    who = make_identities()
    snapshot_run = data_run(EXPERIMENT)
    plan = {"1": (0.0, 0.0), "2": (0.7, 0.08), "3": (0.5, 0.1), "4": (0.0, 0.85)}
    evals = {}
    for number, (improve, regress) in plan.items():
        run_id = training_run(Path(hf_dir), tmp=Path(tmp), variant=int(number), experiment=EXPERIMENT,
                              data_run_id=snapshot_run)
        sweep = {Tag.SWEEP_STUDY: "tiny", Tag.SWEEP_TRIAL: "2", Tag.SWEEP_TRIAL_STATE: "COMPLETE"} \
            if number == "3" else None
        training_history(run_id, seed=int(number), extra_tags=sweep)
        version = register(who["tina"], run_id, model)
        assert version == number, f"expected version {number}, got {version}"
        evals[number] = eval_run(model, number, improve=improve, regress=regress,
                                 offending=("rr-mc-03",) if number == "4" else ())
    gate_run(model, "1", evals["1"])
    request(who["tina"], model, "1", "production", "first release")
    decide(who["alice"], model, "1", "floors met", approve=True)
    promote(who["bob"], model, "1", "production", expect_version="none")
    for number in ("2", "3", "4"):
        gate_run(model, number, evals[number], champion=("1", evals["1"]))
    request(who["tina"], model, "2", "production", "better refund and shipping answers")
    request(who["alice"], model, "3", "production", "my sweep winner")
    request(who["tina"], model, "4", "production", "faster, please check")
    return {"who": who, "model": model, "evals": evals}


# --------------------------------------------------------------------------- driving the app in tests


def app_test(timeout: float = 120):
    """An AppTest of the whole app (the entry script, its navigation and pages)."""
    from streamlit.testing.v1 import AppTest

    entry = Path(__file__).resolve().parent / "web" / "main.py"
    return AppTest.from_file(str(entry), default_timeout=timeout)


def log_in(at, name: str, password: str):
    """Fill the login form and submit it; returns the AppTest after the run."""
    at.run()
    at.text_input(key="login_user").input(name)
    at.text_input(key="login_password").input(password)
    return at.button(key="login_submit").click().run()


def open_page(at, page: str, **params):
    """Switch to one of the app's pages (models, version, compare, approvals, release, ledger) and run it."""
    from app.ui import PAGES

    at.query_params.clear()
    at.query_params.update({k: str(v) for k, v in params.items()})
    return at.switch_page(PAGES[page]).run()


def request_key(model: str, version: str) -> str:
    """The widget-key suffix of a pending request on the Approvals page."""
    from registry.audit import model_state

    req = [r for r in model_state(model).pending() if r.version == str(version)][-1]
    return f"{model}-{version}-{req.seq}"
