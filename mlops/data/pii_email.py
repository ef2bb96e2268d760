"""Finders for email addresses, as written and as people hide them from scrapers: "jane [at] example [dot] com",
"keiko.osullivan at example dot org", "name(at)host(dot)co(dot)uk", "name AT host DOT com", "name @ host . com",
"name at host.com". A training set is not a scraper: every one of those reaches a person.

The spelled-out forms read like prose ("meet me at home dot", "look at this dot plot", "sales at 5 pm"), so a
bracketed "(at)" is taken as it stands, but a bare " at " or a spaced " @ " needs more before it counts: a
domain of two labels or more that ends in a known top-level domain, a local part that is not an everyday word
("available at example.com" is a shop, not a mailbox), and a top-level domain not written like a capitalised
word ("I'm at home.It was late" is a missing space).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

from mlops.data.pii_structured import folded

Span = tuple[int, int]

_LOCAL = r"[\w!#$%&'*+/=?^`{|}~-]+(?:\.[\w!#$%&'*+/=?^`{|}~-]+)*"
_LABEL = r"[^\W_](?:[\w-]{0,61}[^\W_])?"
_TLD = r"(?:[^\W\d_]{2,63}|xn--[a-z0-9-]{2,59})"
EMAIL_RE = re.compile(rf"(?<![\w.+-]){_LOCAL}@(?:{_LABEL}\.)+{_TLD}(?![\w-])")

_OPEN, _CLOSE = r"[\[(<{]", r"[\])>}]"
# A separator is bracketed ("(at)", "[dot]"), a spelled word between spaces (" at ", " DOT "), or the symbol
# itself with spaces around it (" @ ", " . "). Only spaces and tabs: an address never runs over a line break,
# and a dot with a space after it only ends a sentence ("... dot com. Thanks").
_AT = rf"(?P<at>[ \t]*{_OPEN}[ \t]*(?:at|@)[ \t]*{_CLOSE}[ \t]*|[ \t]+-?at-?[ \t]+|[ \t]*@[ \t]*)"
_WORD_DOT = rf"(?:[ \t]*{_OPEN}[ \t]*(?:dot|\.)[ \t]*{_CLOSE}[ \t]*|[ \t]+-?dot-?[ \t]+|[ \t]+\.[ \t]+)"
_DOT = rf"(?:{_WORD_DOT}|\.)"
_PLAIN_LOCAL = r"[\w+-]+(?:\.[\w+-]+)*"
OBFUSCATED_EMAIL_RE = re.compile(
    rf"(?<![\w.+@'’-])(?P<local>{_PLAIN_LOCAL}(?:{_WORD_DOT}{_PLAIN_LOCAL})*){_AT}"
    rf"(?P<domain>{_LABEL}(?:{_DOT}{_LABEL})+)(?![\w-])",
    re.IGNORECASE,
)
DOT_SPLIT = re.compile(_DOT, re.IGNORECASE)
MAIL_CUE = re.compile(r"\b(?:e-?mail\w*|mail\w*|inbox|write|wrote|contact\w*|reach\w*|cc|bcc|drop\s+a\s+line|"
                      r"courriel|correo|escr[ií]b\w*|schreib\w*|kontakt\w*|adresse|address)\b", re.IGNORECASE)
WORD_DOT_SPLIT = re.compile(rf"{_WORD_DOT}|\.", re.IGNORECASE)
# Every form of _AT, matched case-sensitively on pii_structured.folded(text): a gate for the obfuscated forms.
AT_GATE = re.compile(rf"@|{_OPEN}[ \t]*at[ \t]*{_CLOSE}|[ \t]-?at-?[ \t]")

GENERIC_TLDS = frozenset("""
com org net edu gov mil int info biz name pro mobi asia tel travel jobs museum aero coop io ai app dev tech xyz
online site shop store cloud email mail page blog news media agency studio design digital email solutions
company systems services consulting global world life live team works zone today social network group science
academy school university club family""".split())
# Words that sit before " at " in sentences that hold no address: "available at example.com", "I work at ...".
NOT_A_LOCAL = frozenset("""
a an the i me you he him she her it we us they them my your our their this that these those who what here there
is am are was were be been being do does did has have had look looks looking looked stare staring stared glance
work works working worked live lives living lived stay stays staying stayed meet meeting met arrive arrives
arriving arrived find found see seen saw visit visiting visited available online sold sell sells selling buy
bought shop shopping hosted host based located listed posted published shown up out back home office store page
site docs doc documentation details info information more everything anything something nothing one two three
go goes going went come comes coming came get gets got start starts started end ends ended open opens opened
aim aimed aiming point points pointed pointing shoot shot laugh laughed laughing good bad best better great
intern engineer job jobs role position career careers taught teach teaches studied study studies
""".split())


@functools.lru_cache(maxsize=1)
def known_tlds() -> frozenset[str]:
    """Generic top-level domains people write, and every country's: libphonenumber's regions are ISO 3166
    codes, which is what country TLDs are (plus the UK's own "uk", the EU's and two old ones)."""
    import phonenumbers

    countries = {r.lower() for r in phonenumbers.SUPPORTED_REGIONS} | {"uk", "eu", "ac", "su"}
    return GENERIC_TLDS | countries


def _obfuscated_ok(m: re.Match[str]) -> bool:
    at = m.group("at").strip().lower()
    labels = DOT_SPLIT.split(m.group("domain"))
    tld = labels[-1]
    if at.startswith(("(", "[", "{", "<")):
        return tld.isalpha() and len(tld) >= 2  # nobody brackets "at" by accident
    if tld.lower() not in known_tlds() or not (tld.islower() or tld.isupper()):
        return False
    local = m.group("local")
    pieces = [p for p in WORD_DOT_SPLIT.split(local) if p]
    if not pieces or not any(c.isalpha() for c in pieces[0]):
        return False
    if at == "@" or re.search(r"[\d._+-]", local):  # a spaced "@" or "keiko.a": nobody writes those in prose
        return True
    if pieces[0].lower() in NOT_A_LOCAL or pieces[-1].lower() in NOT_A_LOCAL:
        return False
    # "tickets at ticketdesk.com", "order at shop.example.de": a plain word at a host written with real dots is
    # a website in a sentence, unless the sentence is about mail.
    spelled = any(sep != "." for sep in DOT_SPLIT.findall(m.group("domain")))
    return spelled or MAIL_CUE.search(m.string, max(0, m.start() - 60), m.start()) is not None


def find_email(text: str) -> Iterator[Span]:
    if "@" in text:
        yield from (m.span() for m in EMAIL_RE.finditer(text))
    if not AT_GATE.search(folded(text)):
        return
    pos = 0
    while (m := OBFUSCATED_EMAIL_RE.search(text, pos)) is not None:
        if _obfuscated_ok(m):
            yield m.span()
            pos = m.end()
        else:
            # A refused reading ("look at this dot plot") must not hide an address that starts inside it.
            pos = m.start() + 1
