"""Contamination: eval items against the training snapshot a model was trained on, under the snapshot's rule.

The snapshot comes from the model's lineage (`mlops.data_snapshot_id` on its training run or version). Its
samples are token ids, decoded with the model's own tokenizer (the one the snapshot was built with) and cut
back into messages at the special tokens, less the role headers and any text the chat template adds on its
own (a default system prompt). Each message goes through the same `mlops.data.decontam.EvalIndex`, with the
same `ContaminationRule`, that the build's decontamination used (read from the snapshot's manifest), so a
snapshot that passed decontamination against a suite's files reports no contaminated item of that suite.
Samples mixed in from a history snapshot were decontaminated by that snapshot's build, against its eval sets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from evaluation.suites import Suite
from mlops.data.config import ContaminationRule
from mlops.data.decontam import EvalIndex, checkable

_HEADER = re.compile(r"^\s*(system|user|assistant|tool|developer|ipython)[ \t]*\n")
_PROBE = "zq probe text zq"


def rule_of(manifest: dict | None) -> ContaminationRule:
    """The rule a snapshot was decontaminated with (today's defaults for fields an older build lacked)."""
    section = ((manifest or {}).get("config") or {}).get("decontam") or {}
    return ContaminationRule(**{k: v for k, v in section.items() if k in ContaminationRule.model_fields})


def contamination_report(items: Iterable[tuple[str, str, dict]],
                         samples: Iterable[str | tuple[str, Sequence[str]]],
                         rule: ContaminationRule | None = None) -> dict:
    """Pure core: `items` are (suite, task, item) triples; `samples` are training texts, each a message or an
    (id, messages) pair. Returns the counts and every offending item with its first evidence."""
    rule = rule or ContaminationRule()
    index = EvalIndex(rule)
    checked = unchecked = 0
    for suite, task, item in items:
        index.add_item(item, {"suite": suite, "task": task, "id": item.get("id")})
        if checkable(item, rule):
            checked += 1
        else:
            unchecked += 1
    offending: dict[tuple, dict] = {}
    for number, sample in enumerate(samples):
        sample_id, messages = (f"#{number}", [sample]) if isinstance(sample, str) else sample
        for ref, evidence in index.matches(messages):
            key = (ref["suite"], ref["task"], ref["id"])
            entry = offending.setdefault(key, {**ref, "evidence": evidence[:200], "sample": sample_id, "samples": 0})
            entry["samples"] += 1
    return {"status": "checked", "rule": rule.model_dump(), "items_checked": checked,
            "items_too_short": unchecked, "count": len(offending), "offending": list(offending.values())}


def suite_items(suites: list[Suite]) -> list[tuple[str, str, dict]]:
    return [(s.name, t.name, item) for s in suites for t in s.tasks for item in t.items()]


def _segments(tokenizer, ids: list[int], special: set[int]) -> list[str]:
    runs, current = [], []
    for token in ids:
        if token in special:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(token)
    if current:
        runs.append(current)
    texts = tokenizer.batch_decode(runs, skip_special_tokens=True) if runs else []
    return [_HEADER.sub("", text, count=1) for text in texts]


def template_added(tokenizer) -> set[str]:
    """Text the chat template writes without being given it (e.g. a default system prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        return set()
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": _PROBE}], tokenize=False)
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    return {s.strip() for s in _segments(tokenizer, ids, special) if s.strip() and _PROBE not in s}


def snapshot_messages(snapshot: Path, tokenizer, split: str = "train") -> Iterator[tuple[str, list[str]]]:
    """(sample id, messages) of every sample of a snapshot split, decoded from its real tokens."""
    from mlops.data.format import SnapshotReader

    reader = SnapshotReader(snapshot, split=split)
    special = set(tokenizer.all_special_ids)
    added = template_added(tokenizer)
    for i in range(len(reader)):
        sample = reader.get(i)
        ids = sample.input_ids[sample.attention_mask.astype(bool)].tolist()
        messages = [s for s in _segments(tokenizer, ids, special) if s.strip() and s.strip() not in added]
        if messages and len(ids) >= reader.seq_len:
            # A sample cut at seq_len may end inside a word; the stub is no word of the training record.
            messages[-1] = messages[-1].rstrip().rpartition(" ")[0]
        yield sample.sample_id, messages


def suites_covered(manifest: dict | None, suites: list[Suite]) -> dict[str, bool]:
    """Per suite: were all its item files (by sha256) among the eval sets the snapshot was decontaminated against."""
    from mlops.files import file_sha256

    hashes = {e.get("sha256") for e in (manifest or {}).get("eval_sets", [])}
    return {s.label: all(file_sha256(t.file) in hashes for t in s.tasks) for s in suites}


def contamination_for_model(model, suites: list[Suite], cfg, snapshot: Path | str | None = None) -> dict:
    """The report for a resolved model: its lineage snapshot (or `snapshot`) against the given suites."""
    from transformers import AutoTokenizer

    from mlops.data.format import read_manifest
    from mlops.data.snapshot import snapshot_path
    from mlops.errors import NotFoundError

    snapshot_id = str(snapshot) if snapshot else model.snapshot_id
    if not snapshot_id:
        return {"status": "no_snapshot", "snapshot_id": None, "count": None, "offending": [],
                "reason": "the model's lineage names no training snapshot (e.g. a base model)"}
    try:
        folder = snapshot_path(snapshot_id)
    except NotFoundError as err:
        return {"status": "snapshot_missing", "snapshot_id": snapshot_id, "count": None, "offending": [],
                "reason": str(err)}
    manifest = read_manifest(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(model.hf_dir), trust_remote_code=False)
    report = contamination_report(suite_items(suites), snapshot_messages(folder, tokenizer, cfg.split),
                                  rule_of(manifest))
    return {**report, "snapshot_id": snapshot_id, "suites": sorted(s.label for s in suites),
            "decontaminated_against": [e.get("name") for e in (manifest or {}).get("eval_sets", [])],
            "suites_covered": suites_covered(manifest, suites)}
