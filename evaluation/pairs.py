"""Held-out pair accuracy: a preference snapshot's validation pairs written as an eval suite (`pairs`), scored in
deployment form like every suite (lm-eval loglikelihoods through the served gateway).

Each held-out pair is one two-choice item: the prompt as the model was trained on it (rendered with the chat
template, decoded from the snapshot's own tokens) and its two answers as continuations. The task's `acc` is the
share of pairs whose chosen answer the served model gives the higher log-probability (summed over the answer's
tokens, as DPO's implicit reward sums them); the prompt is sent as trained, never rendered again by the eval's
chat template (the suite marks it `rendered`); lm-eval reports its standard error, so the gate compares it with an
interval. DPO's implicit reward is beta x (log p_model - log p_ref): for a candidate and a champion scored against
one reference on the same pairs, the reference's terms are the same on both sides, so a higher share here is a
higher implicit-reward accuracy. The answers alternate between the first and second choice, so a rule that
always picks one position scores one half.

    mlops eval pairs-suite --snapshot <preference snapshot> --out .mlops/suites/round-3
    eval.suites=[general,business,pairs] eval.suite_paths=[.mlops/suites/round-3] eval.gate.must_improve=[pairs_heldout]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from mlops.errors import ConfigError

SUITE = "pairs"
TASK = "pairs_heldout"
AREA = "preference"


def pair_items(snapshot_id: str, *, tokenizer_path: str | Path, limit: int | None = None) -> list[dict]:
    """The validation split's pairs as two-choice items (prompt text, [first, second] answers, the chosen one's
    index), decoded with the tokenizer the snapshot was built with (its hash is checked)."""
    from tokenizers import Tokenizer

    from mlops.data.format import RECORD_TYPE_PREFERENCE, SnapshotReader, record_type
    from mlops.data.snapshot import resolve_snapshot
    from mlops.data.tokenize import tokenizer_info

    folder = resolve_snapshot(snapshot_id)
    rows = SnapshotReader(folder, "validation")
    if record_type(rows.manifest) != RECORD_TYPE_PREFERENCE:
        raise ConfigError(f"snapshot {folder.name} holds {record_type(rows.manifest)} records, not preference pairs. "
                          "Fix: pass the preference snapshot of the DPO round (data.record_type: preference).")
    built_with = rows.manifest.get("tokenizer", {}).get("hash")
    if built_with != tokenizer_info(tokenizer_path)["hash"]:
        raise ConfigError(f"the tokenizer at {tokenizer_path} is not the one snapshot {folder.name} was built with "
                          f"(hash {str(built_with)[:12]}). Fix: pass the base model the snapshot was built for.")
    tok = Tokenizer.from_file(str(Path(tokenizer_path) / "tokenizer.json"))
    count = len(rows) // 2 if limit is None else min(limit, len(rows) // 2)
    items = []
    for i in range(count):
        chosen, rejected = rows.get(2 * i), rows.get(2 * i + 1)
        prompt, chosen_answer = _split(chosen)
        other_prompt, rejected_answer = _split(rejected)
        if prompt != other_prompt:
            raise ConfigError(f"rows {2 * i} and {2 * i + 1} of {folder.name}'s validation split do not share a "
                              "prompt: the snapshot's pairs are broken. Fix: rebuild it.")
        answers = [tok.decode(chosen_answer, skip_special_tokens=False),
                   tok.decode(rejected_answer, skip_special_tokens=False)]
        first = i % 2  # alternate the chosen answer's position
        items.append({"id": chosen.sample_id.rpartition("/")[0], "prompt": tok.decode(prompt, skip_special_tokens=False),
                      "choices": answers if first == 0 else answers[::-1], "answer": first})
    return items


def _split(sample) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of one row: the answer is what the loss mask trains on; the prompt precedes it."""
    real = sample.attention_mask.astype(bool)
    trained = np.flatnonzero(sample.loss_mask.astype(bool) & real)
    start = int(trained[0]) if trained.size else int(real.sum())
    ids = sample.input_ids
    return [int(t) for t in ids[:start]], [int(t) for t in ids[trained]]


def write_pair_suite(snapshot_id: str, out: Path | str, *, tokenizer_path: str | Path, limit: int | None = None,
                     leave_out: frozenset[str] | set[str] = frozenset()) -> Path:
    """Write the `pairs` suite folder under `out` (a folder for eval.suite_paths), less the pairs whose ids are in
    `leave_out`; returns the suite folder."""
    from evaluation.suites import SPEC_FILE, items_fingerprint

    everything = pair_items(snapshot_id, tokenizer_path=tokenizer_path, limit=limit)
    items = [item for item in everything if item["id"] not in leave_out]
    if not items:
        raise ConfigError(f"snapshot {snapshot_id} has no validation pairs to hold out"
                          + (f" that the judged models were not trained on ({len(everything)} left out)"
                             if everything else "")
                          + ". Fix: rebuild it with a larger validation share (data.validation_fraction), or from "
                          "more pairs (questions the judged models never saw in training).")
    folder = Path(out) / SUITE
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{TASK}.jsonl").write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items),
                                          encoding="utf-8")
    spec = {
        "name": SUITE, "version": 1, "baseline_margin": 0.10,
        "description": f"held-out preference pairs of snapshot {snapshot_id}: does the served model prefer the "
                       "chosen answer",
        "snapshot_id": snapshot_id, "items_sha256": items_fingerprint(folder),
        "tasks": [{"name": TASK, "file": f"{TASK}.jsonl", "kind": "multiple_choice", "area": AREA, "primary": "acc",
                   "template": "{{prompt}}", "target_delimiter": "", "rendered": True}],
    }
    (folder / SPEC_FILE).write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return folder


def seen_in_training(folder: Path, models: list, contamination_cfg) -> dict[str, list[str]]:
    """Per judged model (resolved), the ids of the written suite's pairs that its training snapshot holds, by the
    eval's own contamination check (evaluation.contamination): such a pair scores the model's memory, and a
    candidate's eval stops at it (eval.contamination.when_found; a released version's is scored all the same)."""
    from evaluation.contamination import contamination_for_model
    from evaluation.suites import load_suite

    if not models:
        return {}
    suite = load_suite(folder)
    return {model.ref: sorted({str(o["id"]) for o in contamination_for_model(model, [suite], contamination_cfg)
                               ["offending"]}) for model in models}


def suite_ids(folder: Path) -> list[str]:
    """The pair ids a written `pairs` suite holds, in its order."""
    lines = (Path(folder) / f"{TASK}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["id"] for line in lines if line.strip()]
