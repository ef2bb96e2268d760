"""Contamination: word n-gram overlap between every eval item and the training snapshot a model was trained on.

The snapshot comes from the model's lineage (`mlops.data_snapshot_id` on its training run or version). Its
samples are token ids, decoded with the model's own tokenizer (the one the snapshot was built with). An item
offends when more than `min_ratio` of its n-grams (of its prompt and correct answer) occur in the training
text; an item shorter than n words is compared whole. The report lists the count and the offending items.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from evaluation.suites import Suite

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> set[int]:
    if not tokens:
        return set()
    if len(tokens) < n:
        return {hash(tuple(tokens))}
    return {hash(tuple(tokens[i : i + n])) for i in range(len(tokens) - n + 1)}


def training_index(texts: Iterable[str], n: int) -> tuple[set[int], set[int]]:
    """(n-grams of the training text, every shorter-window hash used to match items shorter than n)."""
    grams: set[int] = set()
    short: set[int] = set()
    for text in texts:
        tokens = words(text)
        grams |= ngrams(tokens, n)
        for size in range(1, min(n, len(tokens) + 1)):
            short.update(hash(tuple(tokens[i : i + size])) for i in range(len(tokens) - size + 1))
    return grams, short


def item_text(item: dict) -> str:
    """The prompt plus the correct answer, the parts a leak would reproduce."""
    answer = ""
    if "choices" in item and "answer" in item:
        answer = str(item["choices"][item["answer"]])
    elif "target" in item:
        answer = str(item["target"])
    return f"{item.get('prompt', '')} {answer}".strip()


def contamination_report(items: Iterable[tuple[str, str, dict]], texts: Iterable[str], *, ngram: int = 8,
                         min_ratio: float = 0.0) -> dict:
    """Pure core: `items` are (suite, task, item) triples; returns counts and the offending items."""
    grams, short = training_index(texts, ngram)
    checked, offending = 0, []
    for suite, task, item in items:
        tokens = words(item_text(item))
        if not tokens:
            continue
        checked += 1
        mine = ngrams(tokens, ngram)
        pool = short if len(tokens) < ngram else grams
        hits = len(mine & pool)
        ratio = hits / len(mine)
        if hits and ratio > min_ratio:
            offending.append({"id": item.get("id"), "suite": suite, "task": task, "ratio": round(ratio, 4),
                              "prompt": str(item.get("prompt", ""))[:200]})
    return {"status": "checked", "ngram": ngram, "min_ratio": min_ratio, "items_checked": checked,
            "count": len(offending), "offending": offending}


def suite_items(suites: list[Suite]) -> list[tuple[str, str, dict]]:
    return [(s.name, t.name, item) for s in suites for t in s.tasks for item in t.items()]


def snapshot_texts(snapshot: Path, tokenizer, split: str = "train", batch: int = 256) -> Iterable[str]:
    """Decoded text of every sample of a snapshot split (real tokens only)."""
    from mlops.data.format import SnapshotReader

    reader = SnapshotReader(snapshot, split=split)
    for start in range(0, len(reader), batch):
        rows = []
        for i in range(start, min(start + batch, len(reader))):
            sample = reader.get(i)
            rows.append(sample.input_ids[sample.attention_mask.astype(bool)].tolist())
        yield from tokenizer.batch_decode(rows, skip_special_tokens=True)


def contamination_for_model(model, suites: list[Suite], cfg, snapshot: Path | str | None = None) -> dict:
    """The report for a resolved model: its lineage snapshot (or `snapshot`) against the given suites."""
    from transformers import AutoTokenizer

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
    tokenizer = AutoTokenizer.from_pretrained(str(model.hf_dir))
    report = contamination_report(suite_items(suites), snapshot_texts(folder, tokenizer, cfg.split),
                                  ngram=cfg.ngram, min_ratio=cfg.min_ratio)
    return {**report, "snapshot_id": snapshot_id, "suites": sorted(s.label for s in suites)}
