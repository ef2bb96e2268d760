"""Decontamination: a training record that shares a long word n-gram with an eval item is dropped.

The index holds the n-grams (13 words by default) of every string field of every eval item; items shorter
than n words but at least `min_words` long match as a whole. Each hit names the eval file, line and id.
"""

from __future__ import annotations

import glob
import hashlib
import json
from pathlib import Path
from typing import Any

from mlops.data.dedup import WORD_RE
from mlops.errors import ConfigError

SKIP_KEYS = {"id", "domain", "suite", "task", "type", "category", "label", "role", "metric", "source"}


def _h(tokens: list[str]) -> int:
    return int.from_bytes(hashlib.blake2b(" ".join(tokens).encode(), digest_size=8).digest(), "little")


def strings_of(value: Any, key: str = "") -> list[str]:
    if key in SKIP_KEYS:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings_of(v, str(k))]
    if isinstance(value, list):
        return [s for v in value for s in strings_of(v)]
    return []


def resolve_eval_sets(patterns: list[str], home: Path) -> tuple[list[Path], list[str]]:
    """(files, patterns that matched nothing). Relative patterns are under the project home."""
    files: list[Path] = []
    unmatched = []
    for pattern in patterns:
        full = pattern if Path(pattern).is_absolute() else str(home / pattern)
        found = sorted(Path(p) for p in glob.glob(full, recursive=True) if Path(p).is_file())
        if not found:
            unmatched.append(pattern)
        files += [p for p in found if p not in files]
    return files, unmatched


class EvalIndex:
    def __init__(self, n: int, min_words: int) -> None:
        self.n = n
        self.min_words = min_words
        self.grams: dict[int, dict] = {}
        self.short: dict[int, dict[int, dict]] = {}  # length -> hash -> ref
        self.items = 0

    def add(self, text: str, ref: dict) -> None:
        tokens = WORD_RE.findall(text.lower())
        if len(tokens) >= self.n:
            for i in range(len(tokens) - self.n + 1):
                self.grams.setdefault(_h(tokens[i : i + self.n]), ref)
        elif len(tokens) >= self.min_words:
            self.short.setdefault(len(tokens), {}).setdefault(_h(tokens), ref)

    def add_file(self, path: Path, name: str) -> int:
        count = 0
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except ValueError as err:
                    raise ConfigError(
                        f"eval set '{name}', line {number}: malformed JSON ({err}). "
                        "Fix: correct that line or remove the file from data.decontam.eval_sets."
                    ) from None
                item_id = item.get("id", f"line-{number}") if isinstance(item, dict) else f"line-{number}"
                ref = {"eval_file": name, "eval_line": number, "eval_id": str(item_id)}
                for text in strings_of(item):
                    self.add(text, ref)
                count += 1
        self.items += count
        return count

    def find(self, text: str) -> tuple[dict, str] | None:
        """(eval ref, shared n-gram) of the first leak in `text`, else None."""
        if not self.grams and not self.short:
            return None
        tokens = WORD_RE.findall(text.lower())
        if self.grams:
            for i in range(len(tokens) - self.n + 1):
                ref = self.grams.get(_h(tokens[i : i + self.n]))
                if ref is not None:
                    return ref, " ".join(tokens[i : i + self.n])
        for length, table in self.short.items():
            for i in range(len(tokens) - length + 1):
                ref = table.get(_h(tokens[i : i + length]))
                if ref is not None:
                    return ref, " ".join(tokens[i : i + length])
        return None
