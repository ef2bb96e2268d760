"""`make demo-dpo`: a DPO round from the demo's production feedback (run `make demo` first, in the same home).

The served answers people rated down with a correction, and the shadow's answers to requests rated down, become
preference pairs (`mlops data harvest --pairs`); a reviewer accepts them (scripted here, as in the demo); they build a
preference snapshot; DPO trains a LoRA over the production version's weights (its reference is production itself,
the adapters switched off); the candidate is registered, evaluated in deployment form on the general and business
suites plus the held-out pairs, production is scored on the same pairs, and the gate requires the candidate's pair
accuracy to beat production's beyond the interval with no business or general regression. Nothing is promoted:
the verdict goes to the approvers as every other. Every act is keyed on the stored state, so a rerun reuses it.

    python scripts/demo_dpo.py [--profile smollm2|tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import (  # noqa: E402
    EVAL_CONFIG,
    MODEL,
    PROFILES,
    SERVICE,
    TRAINER,
    latest_run,
    mlflow_run,
    out_json,
    registry,
    sh,
)

INCREMENT = Path("data/harvest/dpo")
HELD_OUT = Path("data/harvest/dpo-heldout")
SUITES = Path(".mlops/demo/suites")
STEPS = {"smollm2": 30, "tiny": 8}  # DPO from production needs few steps: the pairs are few


def review_and_hold_out(path: Path, held_out: Path) -> tuple[int, int]:
    """The reviewer's part, scripted: every harvested pair is taken as it is, and every third one is held out of
    training for the pairwise eval (written to its own increment, so no split can leave the eval without pairs)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    held = []
    for i, row in enumerate(rows):
        if i % 3 == 0:
            held.append({**row, "accepted": True, "note": "demo review: held out for the pairwise eval"})
            row.update(accepted=False, note="demo review: held out for the pairwise eval")
        else:
            row.update(accepted=True, note="demo review: the corrected answer is preferred")
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    held_out.mkdir(parents=True, exist_ok=True)
    (held_out / path.name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in held))
    return len(rows) - len(held), len(held)


def build_pairs(folder: Path, name: str, p: dict, validation: float) -> str:
    """A preference snapshot of a reviewed pairs folder, built by the service; its id from the data run's tags."""
    sh("mlops", "data", "harvest", "accept", str(folder), "--pairs", "--build", "--config",
       "configs/data/pairs-sample.yaml", f"base_model={p['base']}", f"data.validation_fraction={validation}",
       f"run.run_name={name}", *p.get("pairs_build", []), env=SERVICE)
    return latest_run("mlops.stage=data", f"mlflow.runName={name}", having="mlops.data_snapshot_id")[
        "tags"]["mlops.data_snapshot_id"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="smollm2")
    p = PROFILES[parser.parse_args().profile]
    started = Path(".mlops/demo/started_at")
    production = registry().get("aliases", {}).get("production")
    if not started.exists() or not production:
        raise SystemExit("demo-dpo stopped: no demo state here. Fix: run `make demo` first (it serves production and "
                         "collects the feedback this round learns from).")

    print(f"== pairs from production v{production}'s feedback ==")
    # The demo's spot-check verdicts (grace's, .mlops/demo/spot-*.jsonl) are preferences too.
    spotchecks = [x for f in sorted(Path(".mlops/demo").glob("spot-*.jsonl")) for x in ("--spotchecks", str(f))]
    sh("mlops", "data", "harvest", "--pairs", "--since", started.read_text().strip(), "--out", str(INCREMENT),
       "--model", MODEL, *spotchecks)
    trained, held = review_and_hold_out(INCREMENT / "pairs.jsonl", HELD_OUT)
    print(f"{trained} pairs accepted for training, {held} held out for the pairwise eval")
    snapshot = build_pairs(INCREMENT, "data-dpo", p, 0.1)
    held_out = build_pairs(HELD_OUT, "data-dpo-heldout", p, 0.9999)  # (all but by chance) in its validation split

    print(f"== DPO from v{production} on {snapshot} ==")
    mlflow_run("train", config=p["train"], env=TRAINER, overrides=" ".join([
        "train.mode=dpo", f"train.snapshot={snapshot}", f"base_model=models:/{MODEL}/{production}",
        f"train.max_steps={STEPS[p['base']]}", "train.warmup_steps=2", "train.lr=2e-4", "train.checkpoint_every=10",
        "train.eval_every=10", "run.run_name=train-dpo", *p.get("form", [])]))
    run = latest_run("mlops.stage=train", f"mlops.data_snapshot_id={snapshot}", having="mlops.model_content_id")
    version = str(out_json("mlops", "registry", "register", "--run", run["run_id"], "--name", MODEL, "--json",
                           env=TRAINER)["version"])
    print(f"DPO run {run['run_id']} is models:/{MODEL}/{version}")

    print(f"== held-out pairs, evals and the gate of v{version} against production v{production} ==")
    sh("mlops", "pair-suite", "--snapshot", held_out, "--out", str(SUITES), "--base-model", p["base"])
    # Absolute: `mlflow run` runs the entry point in the project folder, not here.
    overrides = " ".join([*p["eval"], f"eval.suite_paths=[{SUITES.resolve()}]", "eval.suites=[general,business,pairs]"])
    for model, entries in ((f"models:/{MODEL}/{version}", ("eval", "eval_reference")),
                           (f"models:/{MODEL}/{production}", ("eval",))):
        for entry in entries:
            mlflow_run(entry, env=SERVICE, model=model, suites="general,business,pairs", config=EVAL_CONFIG,
                       overrides=overrides)
    gate = mlflow_run("gate", env=SERVICE, check=False, challenger=f"models:/{MODEL}/{version}",
                      champion=f"models:/{MODEL}@production", config=EVAL_CONFIG,
                      overrides=f"{overrides} eval.gate.must_improve=[pairs_heldout]")
    print(f"\nthe DPO candidate v{version}: gate {'passed' if gate.returncode == 0 else 'refused (the report says why)'};"
          " promoting it is the approvers' call, as for every version (`make app`).")


if __name__ == "__main__":
    main()
