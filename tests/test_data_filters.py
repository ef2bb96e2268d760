"""Each quality filter rejects what it must, with its reason, and keeps what it must."""

from __future__ import annotations

import pytest

from mlops.data.config import FilterConfig
from mlops.data.filters import FILTERS, mixed_language_ratio, repeated_ngram_ratio, run_filters, symbol_ratio
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
        rec("Мой роутер не работает уже третий день, интернет пропадает каждый вечер.",
            "Попробуйте перезагрузить роутер и проверить кабель."),  # one script, not Latin: fine
        rec("Café au lait costs €3; the naïve résumé was déjà vu."),  # accented Latin is Latin
        rec("Knowledge base: unplug the router for ten seconds and plug it back in.", kind="text"),
        rec("First step: restart. Second step: wait. Third step: check the light. Then call us back if needed."),
    ],
)
def test_filters_keep_clean_records(record):
    assert run_filters(record, CFG) == (True, "")


def test_thresholds_come_from_config():
    text = "refund now " * 20
    assert run_filters(rec(text), FilterConfig(max_repeated_ngram_ratio=0.99)) == (True, "")
    assert run_filters(rec("Hi", "Ok"), FilterConfig(min_chars=1)) == (True, "")
    assert run_filters(rec("Hi", "  "), FilterConfig(steps=["length"], min_chars=1)) == (True, "")


def test_ratios_measure_what_they_say():
    assert repeated_ngram_ratio("a b c " * 10, 3) > 0.8
    assert repeated_ngram_ratio("one two three four five six seven eight nine ten eleven twelve", 3) == 0
    assert symbol_ratio("plain words only") == 0
    assert symbol_ratio("■■■■") == 1
    assert mixed_language_ratio("english only") == 0
    assert 0.3 < mixed_language_ratio("hello мир hello мир") <= 0.5


def test_unknown_filter_name_suggests():
    with pytest.raises(Exception, match="did you mean 'url_ratio'"):
        FILTERS.get("url_ratoi")
