"""Decontamination: the one rule for "this training text holds an eval item", for the build and the report.

The snapshot build drops every training record in which the index finds an eval item; the eval contamination
report (`evaluation.contamination`) runs the same index over the decoded snapshot. Both go through
`EvalIndex.matches`, with the rule the snapshot was built with (`ContaminationRule`, recorded in its
manifest), and both look at one message at a time, so a snapshot that passed decontamination cannot yield a
contaminated report for the same eval sets.

Normalisation (`leak_words`) folds what a light paraphrase or a copy-edit changes without changing the item:
Unicode compatibility forms, case, punctuation, contractions ("don't" -> "do not"), number words ("thirty"
-> "30", "twenty-four" -> "24") and plural or tense endings. An eval text (every string field of an item but
its metadata) leaks into a message when they share an `ngram`-word run (a text shorter than that, but at
least `min_words` long, must appear whole), or when the message holds `fuzzy_containment` of the eval text's
`fuzzy_shingle`-word shingles (a paraphrase that swaps or inserts a word every few words).
"""

from __future__ import annotations

import glob
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from mlops.data.config import ContaminationRule
from mlops.errors import ConfigError

SKIP_KEYS = {"id", "domain", "suite", "task", "type", "category", "label", "role", "metric", "source",
             "dimension", "topic", "kind"}
# Answers are the facts a training corpus teaches: only a long verbatim copy of one is evidence of a leak.
ANSWER_KEYS = {"choices", "target", "targets", "aliases", "answer", "answers", "checks", "output", "reference"}

_WORD = re.compile(r"[^\W_]+")
_CONTRACTIONS = [(re.compile(p), r) for p, r in (
    (r"\bcan['’]t\b", "can not"), (r"\bwon['’]t\b", "will not"), (r"\bcannot\b", "can not"),
    (r"n['’]t\b", " not"), (r"['’]re\b", " are"), (r"['’]ll\b", " will"), (r"['’]ve\b", " have"),
    (r"['’]m\b", " am"), (r"['’]d\b", " would"),
    (r"\b(what|that|it|there|here|he|she|who|where|how|when|why)['’]s\b", r"\1 is"), (r"['’]s\b", ""),
)]
_UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                     "thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
_ARTICLES = {"a", "an", "the"}  # a copy-edit swaps them freely; keeping them only breaks shingles
_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i > 1}


# Function words: a paraphrase changes them freely, so the fuzzy check asks for the other words.
_FUNCTION = """a about above after again all also am an and any are as at be been before being below between
both but by can could did do does doing down during each either few for from further had has have having he
her here hers him his how i if in into is it its itself just may me might more most must my no nor not now of
off on once only or other our ours out over own same shall she should so some such than that the their them
then there these they this those through to too under until up very was we were what when where whether which
while who whom why will with would you your yours""".split()


def _stem(word: str) -> str:
    """A deliberately crude suffix fold: both sides get the same key, which is all matching needs."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 4 and word.endswith("ed"):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def leak_words(text: str) -> list[str]:
    """The normalised words of a text, as the contamination rule compares them."""
    text = unicodedata.normalize("NFKC", text).casefold()
    for pattern, repl in _CONTRACTIONS:
        text = pattern.sub(repl, text)
    words = _WORD.findall(text)
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in _TENS:
            nxt = words[i + 1] if i + 1 < len(words) else ""
            unit = _UNITS.get(nxt, 0)
            out.append(str(_TENS[word] + unit) if 0 < unit < 10 else str(_TENS[word]))
            i += 2 if 0 < unit < 10 else 1
            continue
        if word not in _ARTICLES:
            out.append(str(_UNITS[word]) if word in _UNITS else _stem(word))
        i += 1
    return out


FUNCTION_WORDS = frozenset(leak_words(" ".join(_FUNCTION)))


def strings_of(value: Any, key: str = "") -> list[str]:
    """Every string of an eval item that could appear in training text (metadata keys excluded)."""
    return [text for text, _ in texts_of(value, key)]


def texts_of(value: Any, key: str = "", answer: bool = False) -> list[tuple[str, bool]]:
    """(text, is an answer) for every string of an eval item, metadata keys excluded."""
    if key in SKIP_KEYS:
        return []
    answer = answer or key in ANSWER_KEYS
    if isinstance(value, str):
        return [(value, answer)]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in texts_of(v, str(k), answer)]
    if isinstance(value, list):
        return [t for v in value for t in texts_of(v, key, answer)]
    return []


def checkable(item: Any, rule: ContaminationRule) -> bool:
    """Whether the rule can find the item at all (some text long enough to count)."""
    return any(len(leak_words(text)) >= (rule.ngram if answer else rule.min_words) for text, answer in texts_of(item))


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
    """Eval texts indexed under one `ContaminationRule`; `matches(messages)` names every item they hold.

    Words are interned to small ints (a window with a word no eval text uses cannot match), so the index
    hashes tuples of ints, which is the same in every worker process.
    """

    def __init__(self, rule: ContaminationRule) -> None:
        self.rule = rule.rule() if hasattr(rule, "rule") else rule
        self.refs: list[dict] = []
        self.vocab: dict[str, int] = {}
        self.grams: dict[tuple, int] = {}  # ngram -> ref index
        self.whole: dict[int, dict[tuple, int]] = {}  # length -> words -> ref index
        self.shingles: dict[tuple, list[int]] = {}  # shingle -> unit indexes
        self.units: list[tuple[int, int, frozenset, str]] = []  # (ref, shingles, content word ids, text)
        self.items = 0

    def _ids(self, words: list[str], grow: bool) -> list[int]:
        if grow:
            return [self.vocab.setdefault(w, len(self.vocab)) for w in words]
        return [self.vocab.get(w, -1) for w in words]

    def add_text(self, text: str, ref_index: int, answer: bool = False) -> None:
        rule = self.rule
        words = leak_words(text)
        if len(words) < (rule.ngram if answer else rule.min_words):
            return
        ids = self._ids(words, grow=True)
        if len(ids) >= rule.ngram:
            for i in range(len(ids) - rule.ngram + 1):
                self.grams.setdefault(tuple(ids[i : i + rule.ngram]), ref_index)
            if answer:
                return
        else:
            self.whole.setdefault(len(ids), {}).setdefault(tuple(ids), ref_index)
        k = rule.fuzzy_shingle
        shingles = {tuple(ids[i : i + k]) for i in range(len(ids) - k + 1)}
        content = frozenset(i for i, w in zip(ids, words, strict=True) if w not in FUNCTION_WORDS)
        unit = len(self.units)
        self.units.append((ref_index, len(shingles), content, " ".join(words)))
        for shingle in shingles:
            self.shingles.setdefault(shingle, []).append(unit)

    def add_item(self, item: Any, ref: dict) -> None:
        self.refs.append(ref)
        for text, answer in texts_of(item):
            self.add_text(text, len(self.refs) - 1, answer)
        self.items += 1

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
                self.add_item(item, {"eval_file": name, "eval_line": number, "eval_id": str(item_id)})
                count += 1
        return count

    def _message(self, text: str) -> Iterator[tuple[int, str]]:
        rule = self.rule
        words = leak_words(text)
        ids = self._ids(words, grow=False)
        n = rule.ngram
        for i in range(len(ids) - n + 1):
            ref = self.grams.get(tuple(ids[i : i + n]))
            if ref is not None:
                yield ref, " ".join(words[i : i + n])
        for length, table in self.whole.items():
            for i in range(len(ids) - length + 1):
                ref = table.get(tuple(ids[i : i + length]))
                if ref is not None:
                    yield ref, " ".join(words[i : i + length])
        k = rule.fuzzy_shingle
        hits: dict[int, int] = {}
        for shingle in {tuple(ids[i : i + k]) for i in range(len(ids) - k + 1)}:
            for unit in self.shingles.get(shingle, ()):
                hits[unit] = hits.get(unit, 0) + 1
        present = set(ids)
        for unit, count in hits.items():
            ref, size, content, unit_text = self.units[unit]
            if (count >= max(rule.fuzzy_containment * size, min(rule.fuzzy_min_shared, size))
                    and len(content & present) >= rule.fuzzy_content * len(content)):
                yield ref, f"~{count}/{size} shingles of: {unit_text[:160]}"

    def matches(self, messages: str | Iterable[str]) -> list[tuple[dict, str]]:
        """(eval ref, evidence) for every eval item one of the messages holds, first evidence per item."""
        if not self.refs:
            return []
        found: dict[int, str] = {}
        for text in [messages] if isinstance(messages, str) else messages:
            for ref, evidence in self._message(text):
                found.setdefault(ref, evidence)
        return [(self.refs[ref], evidence) for ref, evidence in found.items()]

    def find(self, messages: str | Iterable[str]) -> tuple[dict, str] | None:
        """(eval ref, evidence) of the first eval item found in the messages, else None."""
        if not self.refs:
            return None
        for text in [messages] if isinstance(messages, str) else messages:
            for ref, evidence in self._message(text):
                return self.refs[ref], evidence
        return None
