"""Finders for structured PII: phone numbers, payment cards, IBANs and IP addresses (emails are in
mlops.data.pii_email, national ids and API keys in mlops.data.pii_ids). Each finder maps a text to the
(start, end) spans it claims.

A regex only proposes candidates; a library or a checksum decides. Phone numbers are parsed with Google's
libphonenumber (`phonenumbers`) for the international prefix or for a set of home regions; IBANs and
checksummed national ids are checked with `python-stdnum`; cards need a known issuer prefix, a card length
and the Luhn check; IPs must parse; key and token shapes come from `detect-secrets` plus a few providers it
does not know and a cue-plus-entropy rule. Look-alikes are refused by shape and by the words before them:
an order, ticket or tracking number, a version, spaced thousands, a date.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterator

Span = tuple[int, int]

# --------------------------------------------------------------------------- shared context rules

# A label right before a number says what it is. "the phone number on my account is ..." names a phone first,
# so a phone cue earlier in the window wins over the label.
REF_LABEL = re.compile(
    r"(?:order|invoice|ticket|tracking|track|parcel|shipment|package|consignment|waybill|case|ref|reference|"
    r"serial|sku|model|part|item|booking|confirmation|policy|claim|transaction|txn|receipt|account|acct|"
    r"customer|member|membership|loyalty|routing|isbn|imei|zip|postcode|version|firmware|build|release|"
    r"patch|batch|lot|container|voucher|coupon|promo|pnr|po|rma)"
    r"(?:\s*(?:(?:number|num|no|nr|id|code|ref)\b\.?|n[ºo°]\.?))?\s*(?:is\s+|was\s+|:\s*|=\s*|-\s*)?#?\s*\Z",
    re.IGNORECASE,
)
VERSION_CUE = re.compile(
    r"(?:\bv|\b(?:version|ver|firmware|fw|build|release|rev|revision|patch|driver|bios|kernel|sdk|update|updated|"
    r"upgrade|upgraded)\b(?:\s*(?:is|was|to|of|now|currently|still|running|number|no\.?|:|#))*)\s*\Z",
    re.IGNORECASE,
)


SIX_DIGITS = re.compile(r"\d(?:[^\d\n]{0,3}\d){5}")  # phones, cards and ids all have six digits or more

# How re.IGNORECASE compares letters: by their simple lower case ("İ" is "i" to it, though str.lower() makes two
# characters of it), and the letters of each pair below as one (re._casefix; "ſ" is "s", "ı" is "i"; all but the
# combining iota, which is no word character, unlike the iota it equals).
_DOTTED_I = str.maketrans({"İ": "i"})
_RE_CASE_PAIRS = str.maketrans({
    "\u00b5": "\u03bc", "\u0131": "i", "\u017f": "s", "\u03c2": "\u03c3", "\u03d0": "\u03b2",
    "\u03d1": "\u03b8", "\u03d5": "\u03c6", "\u03d6": "\u03c0", "\u03f0": "\u03ba", "\u03f1": "\u03c1", "\u03f5": "\u03b5",
    "\u1c80": "\u0432", "\u1c81": "\u0434", "\u1c82": "\u043e", "\u1c83": "\u0441", "\u1c84": "\u0442", "\u1c85": "\u0442",
    "\u1c86": "\u044a", "\u1c87": "\u0463", "\u1c88": "\ua64b", "\u1e9b": "\u1e61", "\u1fbe": "\u03b9", "\u1fd3": "\u0390",
    "\u1fe3": "\u03b0", "\ufb06": "\ufb05",
})


@functools.lru_cache(maxsize=8)
def folded(text: str) -> str:
    """`text` lower-cased as re.IGNORECASE compares letters, offset for offset and with the same word, space and
    digit characters. A case-insensitive pattern runs at every position of a text and costs ten times a
    case-sensitive one, so a detector first looks for its cue words in this (a case-sensitive gate) and runs
    its patterns only where one is present: a gate that finds nothing proves they cannot match."""
    return text.translate(_DOTTED_I).lower().translate(_RE_CASE_PAIRS)


def before(text: str, start: int, width: int = 48) -> str:
    return text[max(0, start - width) : start]


def labelled_reference(text: str, start: int, cue: re.Pattern[str] | None = None) -> bool:
    window = before(text, start)
    label = REF_LABEL.search(window)
    if label is None:
        return False
    return cue is None or cue.search(window[: label.start()]) is None


def code_char(c: str) -> bool:
    """A character that joins its neighbours into one token. CJK and Thai text run words together without
    spaces ("携帯は080-1234-5678です"): their letters do not glue."""
    return c.isalnum() and not ("\u3040" <= c <= "\u9fff" or "\uac00" <= c <= "\ud7af" or "\uff00" <= c <= "\uffef"
                                or "\u0e00" <= c <= "\u0eff")


def glued(text: str, start: int, end: int) -> bool:
    """The candidate is part of a longer code: letters or code punctuation touch it."""
    prev = text[start - 1] if start else " "
    prev2 = text[start - 2] if start > 1 else " "
    nxt = text[end] if end < len(text) else " "
    nxt2 = text[end + 1] if end + 1 < len(text) else " "
    if code_char(prev) or prev in "#_@&" or code_char(nxt) or nxt in "_@":
        return True
    return (prev in "-/.\\" and code_char(prev2)) or (nxt in "-/." and code_char(nxt2))


# --------------------------------------------------------------------------- phone numbers

PHONE_RUN = re.compile(
    r"(?:\+|\b00)?[ \u00a0]?\(?\d[\d \u00a0().\-/]{4,24}\d(?:[ \u00a0]?(?:x|ext\.?|extension)[ \u00a0]?\d{1,5})?"
)
# Gates: a phone number has seven digits joined by the run's separators (phone_ok), a card four digits and four more.
PHONE_DIGITS = re.compile(r"\d(?:[ \u00a0().\-/]*\d){6}")
CARD_DIGITS = re.compile(r"\d{4}[ .\-\u00a0]?\d{4}")
PHONE_CUE = re.compile(
    r"\b(?:phone|telephone|tel|mobile|cell|cellphone|handy|whats ?app|signal|fax|sms|text me|call|calling|ring|"
    r"dial|landline|hotline|helpline|reach me|contact me|contact number|number to reach|téléphone|portable|"
    r"telefon|teléfono|móvil|telefono|cellulare|电话|手机|電話)\b",
    re.IGNORECASE,
)
HOME_REGIONS = ("US", "GB", "DE", "FR", "CN", "IN", "AU", "JP", "CA", "ES", "IT", "NL", "BR", "MX", "IE", "CH",
                "AT", "BE", "SE", "PL", "SG", "NZ", "ZA", "KR")
DATE_LIKE = re.compile(r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.](?:\d{4}|\d{2})")
ZIP_PLUS4 = re.compile(r"\d{5}-\d{4}")
US_STATE_BEFORE = re.compile(r"\b[A-Z]{2},?[ \u00a0]+\Z")
EXTENSION = re.compile(r"[ \u00a0]?(?:x|ext\.?|extension)[ \u00a0]?\d{1,5}$", re.IGNORECASE)
# Group shapes that are phone formats somewhere (national form, country code dropped).
PHONE_SHAPES = {(3, 3, 4), (1, 3, 3, 4), (2, 2, 2, 2, 2), (3, 4, 4), (5, 5), (4, 3, 3), (2, 4, 4), (4, 4),
                (3, 3, 3, 3), (4, 6), (5, 6), (3, 7), (3, 8), (4, 7), (4, 8), (2, 8), (3, 4, 3), (3, 3, 3, 2),
                (4, 3, 4), (2, 3, 4), (3, 3, 3, 4)}


def thousands(groups: list[str], seps: list[str]) -> bool:
    """1 250 000 / 12.345.678: digits grouped in threes after a short head, one separator kind."""
    return (len(groups) >= 3 and 1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])
            and len(set(seps)) == 1 and seps[0] in (" ", ".", "\u00a0", "'"))


@functools.lru_cache(maxsize=4096)
def _phone_verdict(candidate: str) -> tuple[bool, bool]:
    """(valid somewhere, possible somewhere) per libphonenumber, trying the home regions for national forms."""
    import phonenumbers

    international = candidate.startswith("+") or candidate.startswith("00")
    regions = (None,) if international else HOME_REGIONS
    text = "+" + candidate[2:] if candidate.startswith("00") else candidate
    valid = possible = False
    for region in regions:
        try:
            number = phonenumbers.parse(text, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            return True, True
        possible = possible or phonenumbers.is_possible_number(number)
    return valid, possible


def phone_ok(text: str, start: int, end: int) -> bool:
    candidate = text[start:end]
    core = EXTENSION.sub("", candidate).strip()
    digits = re.sub(r"\D", "", core)
    if not 7 <= len(digits) <= 15 or glued(text, start, end):
        return False
    international = core.startswith("+") or core.startswith("00")
    groups = re.findall(r"\d+", core)
    seps = re.findall(r"\d([^\d]+)(?=\d)", core)
    window = before(text, start, 40)
    cue = PHONE_CUE.search(window) is not None
    if labelled_reference(text, start, PHONE_CUE) or VERSION_CUE.search(window):
        return False
    if ZIP_PLUS4.fullmatch(core) and (not cue or US_STATE_BEFORE.search(window)):  # "Columbus, OH 43215-1234"
        return False
    if DATE_LIKE.fullmatch(core) or (not international and not cue and thousands(groups, seps)):
        return False
    if any(len(s.strip(" \u00a0()")) > 1 for s in seps):  # "12 - 34" or "1..2": arithmetic, ranges
        return False
    if "." in "".join(seps) and min(map(len, groups[1:])) < 2:  # 10.0.19041.1 is a version; 1.800.555.0123 is not
        return False
    valid, possible = _phone_verdict(core)
    if international:
        return possible
    shape = tuple(len(g) for g in groups)
    strong = "(" in core or shape in PHONE_SHAPES or (len(groups) >= 2 and core.lstrip("(").startswith("0"))
    if valid and (len(groups) > 1 or len(digits) >= 10):
        return True
    return possible and (cue or strong)


def find_phone(text: str) -> Iterator[Span]:
    if not PHONE_DIGITS.search(text):
        return
    for m in PHONE_RUN.finditer(text):
        start, end = m.span()
        while start < end and text[start] in " \u00a0":
            start += 1
        if text[start] == "(" and ")" not in text[start:end]:
            start += 1
        if phone_ok(text, start, end):
            yield start, end


# --------------------------------------------------------------------------- payment cards

# One separator kind per number: runs of groups that mix separators are two numbers, not one card.
CARD_RUN = re.compile(
    r"(?<!\d)(?:\d{4}(?P<s1>[ .\-\u00a0])\d{4}(?P=s1)\d{4}(?P=s1)\d{1,4}(?:(?P=s1)\d{1,3})?"
    r"|\d{4}(?P<s2>[ .\-\u00a0])\d{6}(?P=s2)\d{4,5}|\d{4}(?P<s3>[ .\-\u00a0])\d{4}(?P=s3)\d{5}|\d{12,19})(?!\d)"
)


def luhn_ok(digits: str) -> bool:
    from stdnum import luhn

    return digits.isdigit() and luhn.is_valid(digits)


def issuer_ok(digits: str) -> bool:
    """A known issuer prefix (IIN) with one of its card lengths: tracking and order numbers rarely have both."""
    n, two, four = len(digits), int(digits[:2]), int(digits[:4])
    return (
        (digits[0] == "4" and n in (13, 16, 19))  # Visa
        or ((51 <= two <= 55 or 2221 <= four <= 2720) and n == 16)  # Mastercard
        or (two in (34, 37) and n == 15)  # American Express
        or ((four == 6011 or 644 <= int(digits[:3]) <= 649 or two == 65) and 16 <= n <= 19)  # Discover
        or ((300 <= int(digits[:3]) <= 305 or two in (36, 38, 39)) and 14 <= n <= 19)  # Diners
        or (3528 <= four <= 3589 and 16 <= n <= 19)  # JCB
        or (two == 62 and 16 <= n <= 19)  # UnionPay
        or ((two == 50 or 56 <= two <= 69) and 12 <= n <= 19)  # Maestro
        or (2200 <= four <= 2204 and n == 16)  # Mir
    )


def find_card(text: str) -> Iterator[Span]:
    if not CARD_DIGITS.search(text):
        return
    for m in CARD_RUN.finditer(text):
        start, end = m.span()
        digits = re.sub(r"\D", "", m.group(0))
        if glued(text, start, end) or not 12 <= len(digits) <= 19:
            continue
        if issuer_ok(digits) and luhn_ok(digits) and not labelled_reference(text, start, CARD_CUE):
            yield start, end


CARD_CUE = re.compile(r"\b(?:card|visa|mastercard|amex|credit|debit|cc|pan|paid with|pay with)\b", re.IGNORECASE)

# --------------------------------------------------------------------------- IBAN

IBAN_RUN = re.compile(r"\b[A-Z]{2}\d{2}(?:[ \u00a0]?[A-Z0-9]{1,4}){2,9}\b", re.IGNORECASE)


def find_iban(text: str) -> Iterator[Span]:
    from stdnum import iban

    for m in IBAN_RUN.finditer(text):
        parts = re.split(r"([ \u00a0])", m.group(0))
        # The regex may run into the next word ("... 3000 please"): try the longest valid prefix.
        for cut in range(len(parts), 0, -2):
            piece = "".join(parts[:cut])
            # Country modules (Belgian, Spanish inner check digits...) are skipped: a mistyped IBAN is still PII.
            if len(piece) >= 15 and iban.is_valid(piece, check_country=False):
                yield m.start(), m.start() + len(piece)
                break


# --------------------------------------------------------------------------- IP addresses

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4_RE = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?:/\d{{1,2}})?(?::\d{{1,5}})?(?![\w]|\.\d)")
IPV6_RE = re.compile(
    r"(?<![\w:.])\[?(?:[0-9A-Fa-f]{0,4}:){2,7}(?:(?:\d{1,3}\.){3}\d{1,3}|[0-9A-Fa-f]{1,4})?(?:%[\w.]+)?"
    r"(?:\]:\d{1,5}|\])?(?:/\d{1,3})?(?![\w:]|\.\d)"
)
IP_CUE = re.compile(r"\b(?:ip|ipv4|ipv6|address|host|server|router|gateway|dns|ping|connect|subnet|proxy|vpn)\b",
                    re.IGNORECASE)


def _ipv6(candidate: str) -> bool:
    core = re.sub(r"(/\d{1,3}|\]:\d{1,5})$", "", candidate).strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(core).version == 6
    except ValueError:
        return False


def find_ip(text: str) -> Iterator[Span]:
    quads = list(IPV4_RE.finditer(text))
    # A value called a version anywhere in the message is a version everywhere in it.
    versions = {m.group(0) for m in quads if VERSION_CUE.search(before(text, m.start()))}
    for m in quads:
        if m.group(0) not in versions and not labelled_reference(text, m.start(), IP_CUE):
            yield m.span()
    if ":" in text:
        yield from (m.span() for m in IPV6_RE.finditer(text) if _ipv6(m.group(0)))
