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
SCREEN = Path("data/harvest/dpo-screen")
SUITES = Path(".mlops/demo/suites")
STEPS = {"smollm2": 30, "tiny": 8}  # DPO from production needs few steps: the pairs are few


def question(row: dict) -> str:
    """What a customer asked (the prompt turns, case and spacing aside)."""
    return " ".join(" ".join(m.get("content", "") for m in row.get("messages", [])).lower().split())


def related(rows: list[dict]) -> list[str]:
    """Each row's group, named by its first question in sorted order: rows the contamination rule finds in one
    another (a shared run of words or a paraphrase, by the check every eval runs: mlops.data.decontam) are one
    group. Customers ask the same thing in other words, and a question on both sides of the split would score the
    candidate on what it was trained on."""
    from mlops.data.config import ContaminationRule
    from mlops.data.decontam import EvalIndex

    index = EvalIndex(ContaminationRule())
    for i, row in enumerate(rows):
        index.add_item({"question": question(row), "choices": [row["chosen"], row["rejected"]]}, {"row": i})
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for j, row in enumerate(rows):
        for ref, _ in index.matches([question(row), row["chosen"], row["rejected"]]):
            parent[root(ref["row"])] = root(j)
    names: dict[int, str] = {}
    for i, row in enumerate(rows):
        names[root(i)] = min(names.get(root(i), question(row)), question(row))
    return [names[root(i)] for i in range(len(rows))]


def pair_id(row: dict) -> str:
    """The id a build gives a harvested pair (its content id, as `mlops.data.records` reads the row)."""
    from mlops.data.records import to_record

    return to_record(row, "harvest", 0, "support").record_id


def screen(path: Path, p: dict) -> set[str]:
    """The ids of the harvested pairs a build keeps (its quality filters set aside, e.g., a correction too short to
    learn from): every pair built at once, all held out, and listed by `mlops pair-suite --json`."""
    SCREEN.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    (SCREEN / path.name).write_text("".join(json.dumps({**r, "accepted": True, "note": "demo screen"},
                                                       ensure_ascii=False) + "\n" for r in rows))
    snapshot = build_pairs(SCREEN, "data-dpo-screen", p, 0.9999)
    return set(out_json("mlops", "pair-suite", "--snapshot", snapshot, "--out", str(SCREEN / "suite"),
                        "--base-model", p["base"], "--json", env=SERVICE)["pairs"])


def review_and_hold_out(path: Path, held_out: Path, *, usable: set[str]) -> tuple[int, int]:
    """The reviewer's part, scripted: every harvested pair is taken as it is, and every third group of related
    questions (`related`) that can judge (a pair of it survives the build) is held out of training for the pairwise
    eval, with all its pairs (written to its own increment, so no split can leave the eval without pairs). Groups
    are taken in sorted order, so the split does not depend on the harvest's order (by request id: random)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups = related(rows)
    by_group: dict[str, set[str]] = {}
    for row, group in zip(rows, groups, strict=True):
        by_group.setdefault(group, set()).add(pair_id(row))
    judging = sorted(g for g, ids in by_group.items() if ids & usable)
    if not judging:
        raise SystemExit(f"demo-dpo stopped: none of the {len(rows)} harvested pairs can be held out: the build "
                         "sets each aside (`mlops data show` on the data-dpo-screen snapshot says why). Fix: collect "
                         "more corrections (serve more traffic) and rerun.")
    held_groups = set(judging[::3])
    held = []
    for row, group in zip(rows, groups, strict=True):
        if group in held_groups:
            held.append({**row, "accepted": True, "note": "demo review: held out for the pairwise eval"})
            row.update(accepted=False, note="demo review: held out for the pairwise eval")
        else:
            row.update(accepted=True, note="demo review: the corrected answer is preferred")
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    held_out.mkdir(parents=True, exist_ok=True)
    (held_out / path.name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in held))
    return len(rows) - len(held), len(held)


def pairs_per_step(train_config: str) -> list[str]:
    """One pair per micro step, the recipe's pairs per optimizer step by accumulation. The build may set pairs
    aside (an empty or blocklisted answer, a duplicate): a handful of production pairs can end below the recipe's
    micro batch, which the trainer refuses, while one pair a micro step trains on any number."""
    from mlops.config import load_config

    _, _, per_step = load_config(train_config, []).train.batch_layout(1)  # the demo trains in one process
    return ["train.micro_batch_size=1", f"train.global_batch_size={per_step}"]


def snapshot_pairs(snapshot: str, split: str) -> int:
    """Pairs the build kept in a split, from the snapshot's manifest."""
    shown = out_json("mlops", "data", "show", snapshot, "--json")
    return int(shown["pairs"]["per_split"].get(split, 0))


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
    usable = screen(INCREMENT / "pairs.jsonl", p)
    print(f"{len(usable)} of the harvested pairs survive a build")
    trained, held = review_and_hold_out(INCREMENT / "pairs.jsonl", HELD_OUT, usable=usable)
    print(f"{trained} pairs accepted for training, {held} held out for the pairwise eval")
    snapshot = build_pairs(INCREMENT, "data-dpo", p, 0.1)
    held_out = build_pairs(HELD_OUT, "data-dpo-heldout", p, 0.9999)  # (all but by chance) in its validation split
    kept = {"training": snapshot_pairs(snapshot, "train"), "held out": snapshot_pairs(held_out, "validation")}
    print(f"the builds kept {kept['training']} pairs to train on and {kept['held out']} held out")
    if not all(kept.values()):
        raise SystemExit("demo-dpo stopped: the builds kept no pairs " + " and none ".join(
            "to train on" if k == "training" else "held out" for k, v in kept.items() if not v)
            + " (`mlops data show SNAPSHOT` says what was set aside and why). Fix: collect more corrections (serve "
            "more traffic, `make demo` on a new home) and rerun.")

    print(f"== DPO from v{production} on {snapshot} ==")
    mlflow_run("train", config=p["train"], env=TRAINER, overrides=" ".join([
        "train.mode=dpo", f"train.snapshot={snapshot}", f"base_model=models:/{MODEL}/{production}",
        f"train.max_steps={STEPS[p['base']]}", "train.warmup_steps=2", "train.lr=2e-4", "train.checkpoint_every=10",
        "train.eval_every=10", "run.run_name=train-dpo", *pairs_per_step(p["train"]), *p.get("form", [])]))
    run = latest_run("mlops.stage=train", f"mlops.data_snapshot_id={snapshot}", having="mlops.model_content_id")
    version = str(out_json("mlops", "registry", "register", "--run", run["run_id"], "--name", MODEL, "--json",
                           env=TRAINER)["version"])
    print(f"DPO run {run['run_id']} is models:/{MODEL}/{version}")

    print(f"== held-out pairs, evals and the gate of v{version} against production v{production} ==")
    # A pair the candidate was trained on (a near twin of a held-out question) is left out: it would score memory.
    # Production's own traffic repeats what production was trained on: its eval scores such pairs all the same (a
    # released version's eval is a baseline), which only makes the bar higher for the candidate.
    sh("mlops", "pair-suite", "--snapshot", held_out, "--out", str(SUITES), "--base-model", p["base"], "--judged",
       f"models:/{MODEL}/{version}", env=SERVICE)
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
