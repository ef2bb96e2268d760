"""PII scrubbing: typed placeholders for emails, phone numbers, IP addresses, credit cards and national ids.

Detectors run in a fixed order (cards before phones, IPs before phones) so a long digit run is claimed by
the most specific type. Credit cards must pass the Luhn check and IPv6 candidates must parse, so order
numbers and clock times are left alone. `GATE_PATTERNS` are the plain regexes the Great Expectations gate
re-checks on scrubbed text.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from mlops.plugins import Registry

EMAIL_RE = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
SSN_RE = r"\b\d{3}-\d{2}-\d{4}\b"
UK_NINO_RE = r"\b[A-CEGHJ-PR-TW-Z]{2} ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
IPV4_RE = r"\b(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\b"
IPV6_CANDIDATE_RE = r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])"
CARD_CANDIDATE_RE = r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)"
PHONE_RE = (
    r"(?<![\w+])(?<!\d[ .-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)[ .-]?|\d{2,4}[ .-])\d{3,4}[ .-]\d{3,4}"
    r"(?![\w-])(?![ .-]?\d)"
    r"|(?<![\w+])\+\d{1,3}[ .-]?\d{2,4}[ .-]?\d{3,4}[ .-]?\d{3,4}(?![\w-])(?![ .-]?\d)"
)

# Checked again by the gate on scrubbed text; each must never match a placeholder.
GATE_PATTERNS = {"email": EMAIL_RE, "national_id": SSN_RE, "ip_address": IPV4_RE}


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _is_card(match: str) -> bool:
    digits = re.sub(r"\D", "", match)
    return 13 <= len(digits) <= 19 and luhn_ok(digits)


def _is_ipv6(match: str) -> bool:
    try:
        return ipaddress.ip_address(match).version == 6
    except ValueError:
        return False


@dataclass(frozen=True)
class Detector:
    name: str
    placeholder: str
    pattern: re.Pattern[str]
    check: Callable[[str], bool] | None = None


DETECTORS: Registry[Detector] = Registry("PII detector")
for _det in (
    Detector("email", "[EMAIL]", re.compile(EMAIL_RE)),
    Detector("credit_card", "[CREDIT_CARD]", re.compile(CARD_CANDIDATE_RE), _is_card),
    Detector("national_id", "[NATIONAL_ID]", re.compile(f"{SSN_RE}|{UK_NINO_RE}")),
    Detector("ip_address", "[IP_ADDRESS]", re.compile(f"{IPV4_RE}|{IPV6_CANDIDATE_RE}"),
             lambda m: "." in m or _is_ipv6(m)),
    Detector("phone", "[PHONE]", re.compile(PHONE_RE)),
):
    DETECTORS.add(_det.name, _det)


class Scrubber:
    """Replaces PII in text; `counts` accumulates replacements per type."""

    def __init__(self, types: list[str]) -> None:
        self.detectors = [DETECTORS.get(name) for name in types]
        self.counts: Counter[str] = Counter()

    def scrub(self, text: str) -> str:
        for det in self.detectors:
            text = self._apply(det, text)
        return text

    def _apply(self, det: Detector, text: str) -> str:
        if det.name == "email" and "@" not in text:
            return text  # the cheap test skips most texts

        def replace(m: re.Match[str]) -> str:
            if det.check is not None and not det.check(m.group(0)):
                return m.group(0)
            self.counts[det.name] += 1
            return det.placeholder

        return det.pattern.sub(replace, text)

    def find(self, text: str) -> list[tuple[str, str]]:
        """(type, match) pairs still present in `text`: what the scrubber would replace."""
        found = []
        for det in self.detectors:
            found += [(det.name, m.group(0)) for m in det.pattern.finditer(text)
                      if det.check is None or det.check(m.group(0))]
        return found
