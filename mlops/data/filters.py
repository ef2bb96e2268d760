"""Quality filters. Each is a registered step `(record, cfg) -> (ok, reason)`; thresholds come from config.

Ratios are measured on the record's text (all message contents). Reasons become counters and rejected
records go to the quarantine file with their reason.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable

from mlops.data.config import FilterConfig
from mlops.data.records import Record
from mlops.plugins import Registry

Verdict = tuple[bool, str]
Filter = Callable[[Record, FilterConfig], Verdict]
FILTERS: Registry[Filter] = Registry("quality filter")
OK: Verdict = (True, "")

URL_RE = re.compile(r"(?:https?://|www\.)\S+", re.IGNORECASE)
WORD_RE = re.compile(r"\w+", re.UNICODE)
# Punctuation that prose, code and support tickets use all the time; anything else non-alphanumeric counts.
PLAIN_PUNCT = set(".,;:!?'\"()[]-_/%&@#$*+=€£\n\t ")


def words(text: str) -> list[str]:
    return WORD_RE.findall(text.lower())


@FILTERS.register("empty_assistant")
def empty_assistant(record: Record, cfg: FilterConfig) -> Verdict:
    if record.kind == "text":
        return OK
    turns = [m for m in record.messages if m["role"] == "assistant"]
    if not turns:
        return False, "no_assistant_turn"
    if any(not m["content"].strip() for m in turns):
        return False, "empty_assistant_turn"
    return OK


@FILTERS.register("length")
def length(record: Record, cfg: FilterConfig) -> Verdict:
    n = len(record.text)
    if n < cfg.min_chars:
        return False, "too_short"
    if n > cfg.max_chars:
        return False, "too_long"
    return OK


def url_ratio(text: str) -> float:
    if not text:
        return 0.0
    return sum(len(m.group(0)) for m in URL_RE.finditer(text)) / len(text)


@FILTERS.register("url_ratio")
def url_filter(record: Record, cfg: FilterConfig) -> Verdict:
    return (False, "url_ratio") if url_ratio(record.text) > cfg.max_url_ratio else OK


def symbol_ratio(text: str) -> float:
    chars = [c for c in URL_RE.sub("", text) if not c.isspace()]
    if not chars:
        return 0.0
    odd = sum(1 for c in chars if not c.isalnum() and c not in PLAIN_PUNCT)
    # Runs of plain punctuation ("!!!!", "$$$$") are garbage too; odd symbols are already counted.
    runs = sum(len(m.group(0)) for m in re.finditer(r"([^\w\s])\1{2,}", text) if m.group(1) in PLAIN_PUNCT)
    return min(1.0, (odd + runs) / len(chars))


@FILTERS.register("symbol_ratio")
def symbol_filter(record: Record, cfg: FilterConfig) -> Verdict:
    return (False, "symbol_ratio") if symbol_ratio(record.text) > cfg.max_symbol_ratio else OK


def repeated_ngram_ratio(text: str, n: int) -> float:
    """Share of word n-grams that repeat an earlier one (Gopher-style); 0 for texts too short to judge."""
    tokens = words(text)
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if len(grams) < 10:
        return 0.0
    counts = Counter(grams)
    return sum(c - 1 for c in counts.values()) / len(grams)


@FILTERS.register("repeated_ngrams")
def repeated_filter(record: Record, cfg: FilterConfig) -> Verdict:
    ratio = repeated_ngram_ratio(record.text, cfg.repeated_ngram)
    return (False, "repeated_ngrams") if ratio > cfg.max_repeated_ngram_ratio else OK


def script_of(ch: str) -> str:
    if ch < "\u0250":
        return "LATIN"
    name = unicodedata.name(ch, "")
    first = name.split(" ", 1)[0]
    return "CJK" if first in ("CJK", "HIRAGANA", "KATAKANA", "HANGUL") else first


def mixed_language_ratio(text: str) -> float:
    """Share of letters outside the dominant script (Latin, Cyrillic, CJK, Arabic, ...)."""
    if text.isascii():
        return 0.0
    scripts = Counter(script_of(c) for c in text if c.isalpha())
    total = sum(scripts.values())
    if total == 0:
        return 0.0
    return 1 - max(scripts.values()) / total


@FILTERS.register("mixed_language")
def mixed_language(record: Record, cfg: FilterConfig) -> Verdict:
    ratio = mixed_language_ratio(record.text)
    return (False, "mixed_language") if ratio > cfg.max_mixed_language_ratio else OK


def run_filters(record: Record, cfg: FilterConfig) -> Verdict:
    """The first failing step decides; a record that passes every step is kept."""
    for name in cfg.steps:
        ok, reason = FILTERS.get(name)(record, cfg)
        if not ok:
            return False, reason
    return OK
