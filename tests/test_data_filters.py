"""Each quality filter rejects what it must, with its reason, and keeps what it must."""

from __future__ import annotations

import pytest

from mlops.data.config import FilterConfig
from mlops.data.filters import (
    FILTERS,
    char_repetition_ratio,
    foreign_share,
    markup_ratio,
    mixed_language_ratio,
    repeated_ngram_ratio,
    run_filters,
    symbol_ratio,
)
from mlops.data.records import Record

CFG = FilterConfig()
GOOD_ANSWER = "Open Billing in the app, pick the invoice from March and tap Dispute charge next to the fee."


def rec(user: str, assistant: str | None = GOOD_ANSWER, kind: str = "chat") -> Record:
    if kind == "text":
        return Record("r-1", "src.jsonl", 1, "general", "text", [{"role": "text", "content": user}])
    messages = [{"role": "user", "content": user}]
    if assistant is not None:
        messages.append({"role": "assistant", "content": assistant})
    return Record("r-1", "src.jsonl", 1, "general", kind, messages)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (rec("Why was I charged twice?", "   "), "empty_assistant_turn"),
        (rec("Why was I charged twice?", None), "no_assistant_turn"),
        (rec("Hi", "Ok"), "too_short"),
        (rec("Please read this. " * 300), "too_long"),
        (rec("deals http://spam.example/a http://spam.example/b https://spam.example/c www.spam.example/d", "Ok thanks"),
         "url_ratio"),
        (rec("▒░▓ ��� ■□ ^^^ ¤¤¤ ~~~ ||| ▀▄ " * 4, "Noted, we will look into it."), "symbol_ratio"),
        (rec("refund now " * 20, "We will check the refund for you today."), "repeated_ngrams"),
        (rec("Здравствуйте, мой роутер не работает уже третий день, the router does not work since Monday",
             "We will send a technician."), "mixed_language"),
        (rec("Why was I charged twice this month?", "Ok"), "short_answer"),
        (rec("Why was I charged twice this month?", "Yes, sure."), "short_answer"),
        (rec("What is this file? " + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkw" * 8), "encoded_blob"),
        (rec("see attachment: " + "9f8e7d6c5b4a3928" * 4 + " " + "a1b2c3d4e5f60718" * 4), "encoded_blob"),
        (rec("PK\x03\x04\x14\x00\x06\x00\x08\x00 zipped bytes \x00\x00\x01 the attachment did not open"),
         "binary_text"),
        (rec("<div class='nav'><ul><li><a href='/'>Home</a></li><li><a href='/help'>Help</a></li></ul></div>"
             "&nbsp;&copy; 2024 Northwind"), "markup"),
        (rec("aaaaaaaaaaaaaaaaaaaaaaaaaaaa hahahahahahahahahahaha why is my bill so high"), "char_repetition"),
        (rec("Mein Router funktioniert seit Montag nicht mehr, bitte helfen Sie mir schnell.",
             "Bitte starten Sie den Router neu und prüfen Sie alle Kabel am Gerät."), "wrong_language"),
    ],
)
def test_filter_rejects_with_reason(record, reason):
    assert run_filters(record, CFG) == (False, reason)


@pytest.mark.parametrize(
    "record",
    [
        rec("Why was I charged twice this month? My order number is NW-123456."),
        rec("See https://northwind.example/help for the guide I followed, it did not work."),  # one URL is fine
        rec("The total was $1,432.50 (incl. 20% VAT) & the fee was #3 on the list: odd!"),  # common punctuation
        rec("Café au lait costs €3; the naïve résumé was déjà vu."),  # accented Latin is English here
        rec("Knowledge base: unplug the router for ten seconds and plug it back in.", kind="text"),
        rec("First step: restart. Second step: wait. Third step: check the light. Then call us back if needed."),
    ],
)
def test_filters_keep_clean_records(record):
    assert run_filters(record, CFG) == (True, "")


@pytest.mark.parametrize(
    "text",
    [
        "My router shows <b>offline</b> in the app & the light is red.",  # a little markup is fine
        "hahaha fair enough, the router came back after the restart",
        "The error code was 0000000 and then 1111111 after the reboot.",
        "The password hint field shows ==== and nothing else, odd.",
        "Order NW-123456 and NW-123457 both arrived, thanks a lot!",
    ],
)
def test_new_junk_filters_keep_ordinary_text(text):
    assert run_filters(rec(text), CFG) == (True, "")


def test_one_script_in_another_language_passes_mixed_language_but_not_language():
    russian = rec("Мой роутер не работает уже третий день, интернет пропадает каждый вечер.",
                  "Попробуйте перезагрузить роутер и проверить кабель.")
    assert run_filters(russian, FilterConfig(languages=[])) == (True, "")  # one script, not Latin: not "mixed"
    assert run_filters(russian, CFG) == (False, "wrong_language")
    assert run_filters(russian, FilterConfig(languages=["en", "ru"])) == (True, "")


def test_thresholds_come_from_config():
    text = "refund now " * 20
    assert run_filters(rec(text), FilterConfig(max_repeated_ngram_ratio=0.99)) == (True, "")
    assert run_filters(rec("Hi", "Ok"), FilterConfig(min_chars=1, min_answer_words=1)) == (True, "")
    assert run_filters(rec("Hi", "  "), FilterConfig(steps=["length"], min_chars=1)) == (True, "")


def test_ratios_measure_what_they_say():
    assert repeated_ngram_ratio("a b c " * 10, 3) > 0.8
    assert repeated_ngram_ratio("one two three four five six seven eight nine ten eleven twelve", 3) == 0
    assert symbol_ratio("plain words only") == 0
    assert symbol_ratio("■■■■") == 1
    assert mixed_language_ratio("english only") == 0
    assert 0.3 < mixed_language_ratio("hello мир hello мир") <= 0.5
    assert char_repetition_ratio("aaaaaaaaaa") == 1 and char_repetition_ratio("a normal sentence here") == 0
    assert markup_ratio("<p>hi</p>") > 0.7 and markup_ratio("a < b and c > d") == 0
    english_with_loanwords = ("Café au lait costs €3; the naïve résumé was déjà vu. The rest of this message is plain "
                              "English about my router and the bill.")
    assert foreign_share(english_with_loanwords, ["en"], 0.5) < 0.5


def test_unknown_filter_name_suggests():
    with pytest.raises(Exception, match="did you mean 'url_ratio'"):
        FILTERS.get("url_ratoi")


def test_config_rejects_unknown_filters_languages_and_pii_types_when_read():
    from mlops.config import validate_config
    from mlops.errors import ConfigError

    for data, hint in (({"filters": {"steps": ["length", "markpu"]}}, "did you mean 'markup'"),
                       ({"filters": {"languages": ["english"]}}, "unknown language code 'english'"),
                       ({"pii": {"types": ["email", "phonee"]}}, "did you mean 'phone'"),
                       ({"gate": {"suite": "snapshot_bach"}}, "did you mean 'snapshot_batch'")):
        with pytest.raises(ConfigError, match=hint):
            validate_config({"base_model": "tiny", "data": data})


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("Classify the priority of this ticket as low, medium or high.\n\nMy router is down.", "high"),
        ("Extract the order number from this message.\n\nMy order number is NW-239360.", "NW-239360"),
        ("Is the router covered by the warranty? Answer yes or no.", "Yes."),
    ],
)
def test_short_answers_to_requests_for_short_answers_are_kept(prompt, answer):
    assert run_filters(rec(prompt, answer), CFG) == (True, "")


def test_symbol_ratio_counts_exactly_the_characters_its_definition_names():
    """The ratio is counted by regex for speed; it must count what the rule says, character by character:
    non-space characters outside URLs, of which those neither alphanumeric nor plain punctuation are odd."""
    import random
    import re

    from mlops.data.filters import PLAIN_PUNCT, URL_RE, symbol_ratio

    def by_character(text: str) -> float:
        chars = [c for c in URL_RE.sub("", text) if not c.isspace()]
        if not chars:
            return 0.0
        odd = sum(1 for c in chars if not c.isalnum() and c not in PLAIN_PUNCT)
        runs = sum(len(m.group(0)) for m in re.finditer(r"([^\w\s])\1{2,}", text) if m.group(1) in PLAIN_PUNCT)
        return min(1.0, (odd + runs) / len(chars))

    rng = random.Random(5)
    alphabet = [chr(i) for i in range(0x20, 0x3100)] + list("\u00a0\u2028\u3000\x1c\x85_\t\n") + ["https://x.io/a "]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    texts += ["$$$$ !!!! ????", "plain words only", "   ", "\u00b2\u2153 \u0663 numbers", "emoji 🙂 ✓ ©"]
    assert [symbol_ratio(t) for t in texts] == [by_character(t) for t in texts]
    assert symbol_ratio("emoji 🙂 ✓ ©") > 0 and symbol_ratio("plain words only") == 0
