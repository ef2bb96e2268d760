"""The PII scrubber replaces what it must with typed placeholders and leaves look-alikes alone."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlops.data.pii import DETECTORS, GATE_PATTERNS, Scrubber, luhn_ok


@pytest.fixture
def scrubber() -> Scrubber:
    return Scrubber(DETECTORS.names() and ["email", "credit_card", "national_id", "ip_address", "phone"])


@pytest.mark.parametrize(
    ("text", "expected", "kind"),
    [
        ("write to jane.doe+billing@example.co.uk today", "write to [EMAIL] today", "email"),
        ("call me on +1 415-555-0132 after 5", "call me on [PHONE] after 5", "phone"),
        ("my number is (020) 7946 0958.", "my number is [PHONE].", "phone"),
        ("my number is 555-867-5309", "my number is [PHONE]", "phone"),
        ("server 192.168.10.254 is down", "server [IP_ADDRESS] is down", "ip_address"),
        ("v6 host 2001:db8:85a3::8a2e:370:7334 failed", "v6 host [IP_ADDRESS] failed", "ip_address"),
        ("loopback ::1 is fine", "loopback [IP_ADDRESS] is fine", "ip_address"),
        ("card 4111 1111 1111 1111 exp 09/27", "card [CREDIT_CARD] exp 09/27", "credit_card"),
        ("card 5500-0000-0000-0004 declined", "card [CREDIT_CARD] declined", "credit_card"),
        ("SSN 123-45-6789 on file", "SSN [NATIONAL_ID] on file", "national_id"),
        ("NI number AB 12 34 56 C please", "NI number [NATIONAL_ID] please", "national_id"),
    ],
)
def test_scrubber_replaces_pii_with_typed_placeholder(scrubber, text, expected, kind):
    assert scrubber.scrub(text) == expected
    assert scrubber.counts == {kind: 1}
    assert scrubber.find(expected) == []


@pytest.mark.parametrize(
    "text",
    [
        "order 4111 1111 1111 1112 shipped",  # 16 digits that fail the Luhn check
        "meeting at 10:30:00 tomorrow",  # a clock time is not IPv6
        "version 3.2 of the app, build 20240301",
        "the total was 1432.50 dollars on 2024-03-01",
        "ticket #A7F3-221 is open",
        "email support at the help desk",  # no address
        "ratio 12:34 and 56:78",
        "tracking code 1234567890123",  # 13 digits, Luhn fails
    ],
)
def test_scrubber_keeps_lookalikes(scrubber, text):
    assert scrubber.scrub(text) == text
    assert sum(scrubber.counts.values()) == 0


def test_counts_accumulate_per_type(scrubber):
    scrubber.scrub("a@b.io or c@d.org, ip 10.0.0.1")
    scrubber.scrub("call +44 20 7946 0958")
    assert scrubber.counts == {"email": 2, "ip_address": 1, "phone": 1}


def test_luhn():
    assert luhn_ok("4111111111111111") and luhn_ok("79927398713")
    assert not luhn_ok("4111111111111112")


def test_gate_patterns_never_match_placeholders(scrubber):
    text = scrubber.scrub("mail x@y.com ssn 123-45-6789 ip 8.8.8.8 card 4111111111111111")
    assert all(not re.search(p, text) for p in GATE_PATTERNS.values())


@settings(max_examples=60, deadline=None)
@given(body=st.lists(st.integers(0, 9), min_size=14, max_size=14), sep=st.sampled_from(["", " ", "-"]))
def test_every_luhn_valid_16_digit_card_is_scrubbed(body, sep):
    digits = "4" + "".join(map(str, body))
    check = next(d for d in "0123456789" if luhn_ok(digits + d))
    card = digits + check
    grouped = sep.join(card[i : i + 4] for i in range(0, 16, 4))
    scrubber = Scrubber(["email", "credit_card", "national_id", "ip_address", "phone"])
    assert scrubber.scrub(f"paid with {grouped} yesterday") == "paid with [CREDIT_CARD] yesterday"
