"""The PII detectors' cheap gates never hide a match: folded text compares letters as re.IGNORECASE does, each
gate finds something wherever its case-insensitive pattern matches, and the patterns rewritten to scan from a
digit match exactly where their lookbehind-first forms did."""

from __future__ import annotations

import random
import re
import string

import pytest

from mlops.data import pii_address, pii_context, pii_email, pii_ids, pii_structured
from mlops.data.labelled_pii import pii_cases
from mlops.data.pii import ALL_TYPES, Scrubber
from mlops.data.pii_structured import folded
from tests.pii_heldout import heldout_cases

BMP = [chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF]
ODD_LETTERS = ["İ", "ı", "ſ", "\u212a", "ẞ", "ς", "ᲀ"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """The labelled and held-out PII messages, and each again in upper case, swapped case, and with a letter that
    lower-cases oddly put in."""
    base = [c.text for c in pii_cases(seed=15)] + [c.text for c in heldout_cases(seed=23)]
    r = random.Random(5)
    odd = [t[:i] + r.choice(ODD_LETTERS) + t[i:] for t in base for i in [r.randrange(len(t) + 1)]]
    return base + [t.upper() for t in base] + [t.swapcase() for t in base] + odd


def test_folded_keeps_every_offset_and_character_class():
    for ch in BMP:
        low = folded(ch)
        assert len(low) == 1, f"U+{ord(ch):04X} folds to {low!r}"
        for cls in (r"\w", r"\s", r"\d"):
            assert bool(re.match(cls, ch)) == bool(re.match(cls, low)), f"U+{ord(ch):04X} changes {cls}"


def test_folded_equates_what_ignorecase_equates():
    """Each character is re.IGNORECASE-equal to its fold, and everything IGNORECASE matches to a lower-case
    ASCII letter folds to that letter (the gates' cue words are spelled in those)."""
    any_letter = re.compile("[a-z]", re.IGNORECASE)
    for ch in BMP:
        assert re.fullmatch(re.escape(folded(ch)), ch, re.IGNORECASE), f"U+{ord(ch):04X}"
        if any_letter.fullmatch(ch):
            (letter,) = [c for c in string.ascii_lowercase if re.fullmatch(c, ch, re.IGNORECASE)]
            assert folded(ch) == letter, f"U+{ord(ch):04X} should fold to {letter}"


GATED = [
    (pii_ids.ID_CUE_VALUE, pii_ids.ID_CUE_GATE),
    (pii_ids.NINO_CUE_RE, pii_ids.NINO_CUE_GATE),
    (pii_address.ROMANCE_STREET, pii_address.ROMANCE_GATE),
    (pii_address.GERMANIC_STREET, pii_address.GERMANIC_HINT),
    (pii_address.PO_BOX, pii_address.PO_BOX_GATE),
    (pii_email.OBFUSCATED_EMAIL_RE, pii_email.AT_GATE),
    *((cue, pii_context.CUE_GATES[kind]) for kind, cue in pii_context.CUES if kind in pii_context.CUE_GATES),
]


@pytest.mark.parametrize(("pattern", "gate"), GATED, ids=lambda p: str(p)[:40])
def test_a_gate_finds_its_cue_wherever_the_pattern_matches(texts, pattern, gate):
    matched = [t for t in texts if pattern.search(t)]
    assert matched, "the corpus must exercise the pattern"
    missed = [t for t in matched if not gate.search(folded(t))]
    assert not missed, missed[:3]


GERMANIC_HINT_BEFORE = re.compile(
    r"(?:straße|strasse|str\.|weg|gasse|platz|allee|ring|damm|ufer|chaussee|steig|pfad|gracht|laan|plein|straat|kade|"
    r"vej|gade|gatan|vägen|veien|gata|utca|ulica)\s+\d", re.IGNORECASE)


def test_the_germanic_hint_on_folded_text_is_the_case_insensitive_hint(texts):
    extra = ["Hauptstraße 5", "HAUPTSTRASSE 5", "Kungsgatan  12", "Ringweg\t3", "Schloßallee 1", "Bahnhofstr. 7"]
    for text in texts + extra:
        assert bool(GERMANIC_HINT_BEFORE.search(text)) == bool(pii_address.GERMANIC_HINT.search(folded(text)))


# The digit-led patterns as they were written before they scanned from their first digit (or letter).
LOOKBEHIND_FIRST = {
    "SSN_RE": (pii_ids.SSN_RE, r"(?<![\w-])(\d{3})([- \u00a0])(\d{2})\2(\d{4})(?![\w]|-\d)"),
    "BARE9_RE": (pii_ids.BARE9_RE, r"(?<![\w-])\d{9}(?![\w]|-\d)"),
    "cn.ric": (pii_ids.CHECKSUMMED[0][0], r"(?<![\w-])\d{17}[\dXx](?![\w-])"),
    "br.cpf": (pii_ids.CHECKSUMMED[1][0], r"(?<![\w-])\d{3}\.\d{3}\.\d{3}-\d{2}(?![\w-])"),
    "es.dni": (pii_ids.CHECKSUMMED[2][0], r"(?<![\w-])\d{8}-?[A-Z](?![\w-])"),
    "es.nie": (pii_ids.CHECKSUMMED[3][0], r"(?<![\w-])[XYZ]-?\d{7}-?[A-Z](?![\w-])"),
    "in.pan": (pii_ids.CHECKSUMMED[4][0], r"(?<![\w-])[A-Z]{3}[ABCFGHLJPT][A-Z]\d{4}[A-Z](?![\w-])"),
    "fr.nir": (pii_ids.CHECKSUMMED[5][0],
               r"(?<![\w-])[12]\s?\d{2}\s?\d{2}\s?(?:\d{2}|2[AB])\s?\d{3}\s?\d{3}\s?\d{2}(?![\w-])"),
}
TOUCHING = ["123-45-6789", "a123-45-6789", "-123456789", "x123456789", "1234567890", "11010519491231002X",
            "a11010519491231002X", "123.456.789-09", "_123.456.789-09", "12345678Z", "-12345678Z", "X1234567L",
            "AX1234567L", "ABCPD1234F", "ZABCPD1234F", "1 85 05 78 006 084 36", "21 85 05 78 006 084 36"]


@pytest.mark.parametrize("name", sorted(LOOKBEHIND_FIRST))
def test_a_pattern_scanning_from_its_first_character_matches_as_its_lookbehind_form(texts, name):
    pattern, before = LOOKBEHIND_FIRST[name]
    before = re.compile(before)
    for text in texts + TOUCHING + [f"id {t} ok" for t in TOUCHING]:
        assert [m.span() for m in pattern.finditer(text)] == [m.span() for m in before.finditer(text)], text


def test_digit_gates_hold_for_every_phone_and_card_the_detectors_find(texts):
    """phone_ok needs seven digits outside the extension, a card twelve: where the gate finds none, no run has them."""
    for text in texts:
        for m in pii_structured.PHONE_RUN.finditer(text):
            digits = re.sub(r"\D", "", pii_structured.EXTENSION.sub("", m.group(0)))
            if len(digits) >= 7:
                assert pii_structured.PHONE_DIGITS.search(text), text
        for m in pii_structured.CARD_RUN.finditer(text):
            if len(re.sub(r"\D", "", m.group(0))) >= 12:
                assert pii_structured.CARD_DIGITS.search(text), text


@pytest.mark.parametrize(("text", "kind"), [
    ("DATE OF BİRTH: 12 March 1990", "date_of_birth"),
    ("my paſſword is Tr0ub4dor&3", "password"),
    ("MY NAME İS Keiko Tanaka", "name"),
])
def test_a_cue_written_with_a_letter_that_lower_cases_oddly_is_still_found(text, kind):
    """re.IGNORECASE reads "BİRTH" as "birth"; the word checks before the patterns must read it so too."""
    assert kind in [name for name, _ in Scrubber(ALL_TYPES).find(text)]
