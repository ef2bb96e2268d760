"""Approval-app page speed on a large registry, measured in one run.

Seeds (once, kept under --store) a registry of `--models` x `--versions` (50 x 20) versions in the embedded
SQLite store: per version a training run (loss / val_loss / tokens-per-s curves on the champion and the two
newest), a model version with its
lineage and deployment profile tags, and an eval run with `eval/summary.json`, per-task samples and a
contamination report; per model a ledger history (register, request, approve, promote, and a pending request)
with MLflow's aliases and stage tags agreeing; the newest two versions of each model have gate runs against the
champion. Ledger entries and versions are written directly (the registry's actions would re-read every gate on
every step); eval and gate artifacts are what `mlops eval` / `mlops gate` store (see app.testing).

Then times the Models, Version and Compare pages with Streamlit's AppTest, logged in as a viewer:
- cold: the first render after every cached registry read was cleared (what a user sees after an action or
  when `app.cache_ttl_s` expired);
- warm: the median of `--repeats` renders with the cache filled (every click on a page). Goal: < 2 s.
The load average is printed before and after: trust figures from a run that started quiet.

    python benchmarks/bench_app.py [--models 50] [--versions 20] [--repeats 5] [--store .mlops/bench-app]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
EXPERIMENT = "bench-app"
GOAL_S = 2.0


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


# --------------------------------------------------------------------------- seeding


def _training_run(model: str, version: int, template_tags: dict, data_run: str, curves: bool) -> str:
    from mlops.lineage import Tag
    from mlops.tracking import MlflowTracker

    tags = {**template_tags, Tag.CONFIG_HASH: f"cfg-{model}-{version}", Tag.DATA_RUN: data_run,
            Tag.MODEL_ID: f"mc-{model}-{version:04d}", Tag.ACTOR: "tina"}
    tracker = MlflowTracker.start(EXPERIMENT, attach_env_run=False, run_name=f"train {model} v{version}", tags=tags)
    for step in range(1, 41 if curves else 1):
        tracker.log_metrics({"loss": 2.0 / step + 0.5, "tokens_per_s": 5000.0 + step,
                             **({"val_loss": 2.0 / step + 0.6} if step % 5 == 0 else {})}, step=step)
    tracker.log_text("train:\n  lr: 0.0001\n", "config/resolved.yaml")
    tracker.close()
    return tracker.run_id


def _ledger(model: str, versions: dict[int, dict], champion: int) -> list[dict]:
    """What the registry would have written: registrations, one release of `champion`, a pending request."""
    from mlops.lineage import Tag

    rows = []
    for number, v in versions.items():
        lineage = {k: val for k, val in v["tags"].items() if k.startswith("mlops.") and k != Tag.PROFILE}
        rows.append(dict(actor="tina", action="register", model=model, version=str(number), to_stage="candidate",
                         evidence={"run_id": v["run_id"], "content_id": v["tags"][Tag.MODEL_ID],
                                   "profile_hash": v["tags"][Tag.PROFILE_HASH], "trainer": "tina",
                                   "snapshot_id": v["tags"][Tag.SNAPSHOT_ID], "lineage": lineage},
                         reason=f"from training run {v['run_id']}"))
    return rows + [
        dict(actor="tina", action="request", model=model, version=str(champion), from_stage="candidate",
             to_stage="production", reason="release"),
        dict(actor="alice", action="approve", model=model, version=str(champion), to_stage="production",
             reason="ok", evidence={"request_seq": "REQ"}),
        dict(actor="bob", action="promote", model=model, version=str(champion), from_stage="candidate",
             to_stage="production", alias="production", alias_before=None, alias_after=str(champion),
             evidence={"displaced": None, "displaced_to": None, "request_seq": "REQ", "approved_by": "alice"}),
        dict(actor="tina", action="request", model=model, version=str(max(versions)), from_stage="candidate",
             to_stage="production", reason="next release"),
    ]


def seed(store: Path, models: int, versions: int, tiny_path: Path) -> None:
    from app.testing import eval_run, gate_run
    from mlops.lineage import Tag
    from mlops.tracking import client, init_experiment
    from registry import ledger
    from registry.release import STAGE_TAG
    from registry.testing import data_run, make_identities, training_run

    os.environ["MLOPS_HOME"] = str(store)
    init_experiment(EXPERIMENT)
    make_identities()
    snapshot = data_run(EXPERIMENT)
    template = client().get_run(training_run(tiny_path, tmp=store, variant=0, experiment=EXPERIMENT,
                                             data_run_id=snapshot))
    template_tags = {k: v for k, v in template.data.tags.items() if k.startswith("mlops.")}
    logged = f"runs:/{template.info.run_id}/model"
    c = client()
    started = time.perf_counter()
    for m in range(models):
        name = f"model-{m:02d}"
        c.create_registered_model(name)
        made: dict[int, dict] = {}
        for number in range(1, versions + 1):
            # Curves only where Compare reads them (champion and the newest two): logging metrics costs a
            # second per run in MLflow's async queue, and the page's cost does not depend on other runs' curves.
            run_id = _training_run(name, number, template_tags, snapshot, curves=number >= versions - 2)
            tags = {**template_tags, Tag.MODEL_ID: f"mc-{name}-{number:04d}", Tag.SOURCE_RUN: run_id,
                    STAGE_TAG: "candidate"}
            mv = c.create_model_version(name, logged, run_id=run_id, tags=tags)
            made[int(mv.version)] = {"run_id": run_id, "tags": tags}
        champion = versions - 2
        with ledger.locked() as chain:
            request_seq = None
            for row in _ledger(name, made, champion):
                if row.get("evidence", {}).get("request_seq") == "REQ":
                    row["evidence"]["request_seq"] = request_seq
                entry = ledger.append(chain, **row)
                if row["action"] == "request" and request_seq is None:
                    request_seq = entry.seq
        c.set_registered_model_alias(name, "production", str(champion))
        c.set_model_version_tag(name, str(champion), STAGE_TAG, "production")
        evals = {n: eval_run(name, str(n), improve=0.3 + 0.02 * (n % 5), regress=0.05, experiment=EXPERIMENT)
                 for n in range(1, versions + 1)}
        for n in (versions - 1, versions):
            gate_run(name, str(n), evals[n], champion=(str(champion), evals[champion]), experiment=EXPERIMENT)
        done = m + 1
        print(f"  seeded {done}/{models} models ({time.perf_counter() - started:.0f} s)", flush=True)
    (store / ".seeded").write_text(f"{models}x{versions}\n")


# --------------------------------------------------------------------------- timing


def timed(at, page: str, repeats: int, **params) -> dict:
    from app.testing import open_page

    open_page(at, page, **params)
    # Cold: the sidebar's Refresh clears every cached read inside the run, as after an action.
    started = time.perf_counter()
    at.button(key="refresh").click().run()
    cold = time.perf_counter() - started
    problems = [e.value for e in at.exception] + [e.value for e in at.error]
    warm = []
    for _ in range(repeats):
        started = time.perf_counter()
        at.run()
        warm.append(time.perf_counter() - started)
    return {"page": page, "cold": cold, "warm": statistics.median(warm), "warm_max": max(warm),
            "problems": problems}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--store", type=Path, default=REPO / ".mlops" / "bench-app")
    args = parser.parse_args()
    store = (args.store / f"{args.models}x{args.versions}").resolve()
    store.mkdir(parents=True, exist_ok=True)
    os.environ["MLOPS_HOME"] = str(store)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("MLOPS_REGISTRY_DB", None)
    print(load(), "(before)")
    if not (store / ".seeded").exists():
        from mlops.base_models import import_base_model

        cache = Path(os.environ.get("MLOPS_TEST_CACHE", REPO / ".mlops" / "test-cache")) / "models"
        print(f"seeding {args.models} models x {args.versions} versions into {store} (once)", flush=True)
        seed(store, args.models, args.versions, Path(import_base_model("tiny", root=cache)["path"]))
    from app.testing import app_test, log_in
    from registry.testing import PASSWORDS

    started = time.perf_counter()
    at = log_in(app_test(timeout=600), "vic", PASSWORDS["vic"])
    first = time.perf_counter() - started
    model = f"model-{args.models // 2:02d}"
    rows = [timed(at, "models", args.repeats),
            timed(at, "version", args.repeats, model=model, version=str(args.versions)),
            timed(at, "compare", args.repeats, model=model, version=str(args.versions))]
    print(f"\nregistry: {args.models} models x {args.versions} versions; first login + Models render in a fresh "
          f"process (imports included): {first:.2f} s")
    print(f"{'page':10} {'cold s':>8} {'warm s':>8} {'warm max':>9} {'warm/goal':>10}  problems")
    for r in rows:
        print(f"{r['page']:10} {r['cold']:8.2f} {r['warm']:8.2f} {r['warm_max']:9.2f} {r['warm'] / GOAL_S:10.2f}  "
              f"{'; '.join(map(str, r['problems']))[:200] or 'none'}")
    print(load(), "(after)")
    if any(r["problems"] for r in rows):
        sys.exit("a page showed an error")


if __name__ == "__main__":
    main()
