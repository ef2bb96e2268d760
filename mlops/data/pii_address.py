"""Finder for street addresses: street shapes that are addresses on their own (a house number, a street name
and a street word: "221B Baker Street", "Hauptstraße 5", "12 rue de la Paix", "2367 Calle de Alcalá"), and
what people write after "my address is" or "I live at".

An address is masked whole or it leaks: a flat number, a postcode or the city left beside the mask ("2367
[ADDRESS]4 Madrid", "[ADDRESS] 15, 75001 Paris") still points at one door. So a street is grown outwards over
what belongs to it: a unit before it ("Flat 2, "), units after it (Apt, Suite, Unit, #, piso, puerta, 2º B,
3e étage), postcodes (US ZIP and ZIP+4, UK, Canadian, Dutch "1234 AB", 4- to 6-digit European and Asian
forms), the city before or after the postcode and the state or province. A house number is never read out of
the front of a postcode: every number ends where its digits end.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from mlops.data.pii_structured import folded

Span = tuple[int, int]
TRAILING = ".,;:!?)]}\"'`”’»"
DIGIT = re.compile(r"\d")

STREET_WORDS = (
    r"street|st|avenue|ave|av|road|rd|boulevard|blvd|lane|ln|drive|dr|court|ct|way|place|pl|terrace|terr|close|"
    r"crescent|cres|highway|hwy|parkway|pkwy|square|sq|circle|cir|row|mews|gardens|gdns|grove|hill|walk|trail|"
    r"park|parade|pde|esplanade|broadway|alley|plaza|quay|wharf|green|rise|view|vale"
)
_WORD = r"[^\W\d_][\w'’.\-]*"
US_UNIT = r"(?:,?\s+(?:apt|apartment|suite|ste|unit|flat|floor|fl|room|rm|#)\.?\s*#?\s*[\w-]{1,6})"
DIRECTION = r"(?:\s+(?:N|S|E|W|NE|NW|SE|SW|North|South|East|West)\b\.?)"
# Street names are capitalised ("42 Wallaby Way"); "2443 is on its way" is not an address.
NUMBER_FIRST = re.compile(
    rf"\b\d{{1,5}}[A-Za-z]?(?:[-/]\d{{1,5}}[A-Za-z]?)?,?\s+(?:(?:[A-Z]|\d+(?:st|nd|rd|th)\b)[\w'’.\-]*\s+){{1,4}}"
    rf"(?i:{STREET_WORDS})\b\.?{DIRECTION}?(?i:{US_UNIT})?"
)
_ROMANCE_WORDS = (r"rue|avenue|av\.|boulevard|bd|place|allée|allee|chemin|impasse|quai|route|cours|passage|square|"
                  r"calle|avenida|avda\.?|paseo|camino|carrer|avinguda|via|viale|corso|rua|travessa")
_PARTICLES = r"de|du|des|la|le|l'|l’|d'|d’|saint|sainte|del|las|los|di|della|dei|degli|da|do|dos|das"
_ROMANCE_LEADS = r"calle|c/|avenida|avda\.?|plaza|paseo|camino|carrer|via|viale|piazza|corso|largo|rua|travessa|praça"
ROMANCE_STREET = re.compile(
    rf"\b\d{{1,4}}(?:\s?(?:bis|ter))?,?\s+(?:{_ROMANCE_WORDS})\s+(?:(?:{_PARTICLES})\s*)*"
    rf"{_WORD}(?:\s+{_WORD}){{0,3}}"
    rf"|\b(?:{_ROMANCE_LEADS})\s+"
    rf"(?:(?:de|del|la|las|los|di|della|dei|degli|da|do|dos|das)\s+)*{_WORD}(?:\s+{_WORD}){{0,3}},?\s+"
    r"(?:n[º°o]\.?\s*)?\d{1,4}[A-Za-z]?(?![\w])",  # "Calle Mayor, 28014 Madrid": 2801 is no house number
    re.IGNORECASE,
)
# Gates, matched case-sensitively against pii_structured.folded(text) (see there): where they find nothing, the
# case-insensitive street patterns cannot match either.
ROMANCE_GATE = re.compile(rf"\d(?:\s?(?:bis|ter))?,?\s+(?:{_ROMANCE_WORDS})\s|(?:{_ROMANCE_LEADS})\s")
GERMANIC_HINT = re.compile(r"(?:straße|strasse|str\.|weg|gasse|platz|allee|ring|damm|ufer|chaussee|steig|pfad|gracht|"
                           r"laan|plein|straat|kade|vej|gade|gatan|vägen|veien|gata|utca|ulica)\s+\d")
PO_BOX_GATE = re.compile(r"(?:box|postfach|apartado)\s+\d")
ADDRESS_WORDS = ("address", "live", "moved", "ship", "deliver", "send", "mail", "located", "i'm at", "habite", "wohne",
                 "vivo", "dirección", "adresse")
GERMANIC_STREET = re.compile(
    r"\b[^\W\d_][\w\-]*(?:straße|strasse|str\.|weg|gasse|platz|allee|ring|damm|ufer|chaussee|steig|pfad|gracht|"
    r"laan|plein|straat|kade|vej|gade|gatan|vägen|veien|gata|utca|ulica)\s+\d{1,4}\s?[a-zA-Z]?\b",
    re.IGNORECASE,
)
PO_BOX = re.compile(r"\b(?:P\.?\s?O\.?\s?Box|Post\s+Office\s+Box|Postfach|Apartado)\s+\d{1,8}\b", re.IGNORECASE)
# After the street: ", Springfield, IL 62704", ", London NW1 6XE", ", 10115 Berlin", "75002 Paris", "1015 CJ".
POSTCODE = (r"(?:\d{4}[ \t]?[A-Z]{2}(?![\w'’])|\d{4,5}(?:-\d{3,4})?|[A-Z]{1,2}\d[A-Z\d]?\s?\d[A-Z]{2}|"
            r"[A-Z]\d[A-Z]\s?\d[A-Z]\d|\d{3}-\d{4}|\d{3}\s?\d{2}|\d{6}|\d{2}-\d{3})")
_END = r"(?=[\s,.;!?)]|$)"
# "Frankfurt am Main", "Newcastle upon Tyne", "Châlons-en-Champagne": a city may hold a small word.
CITY = (rf"[A-Z][\w'’.\-]*(?:\s+(?:(?:am|an|der|upon|sur|ob|im|en|di|del)\s+)?(?!{POSTCODE}{_END})"
        rf"[A-Z][\w'’.\-]*){{0,2}}")
# A city after a comma, a postcode after a comma or a space: never the capitalised first word of a new sentence.
# On a new line only with a postcode beside the city: a bare capitalised word there starts the next line's text.
TAIL_SEGMENT = re.compile(rf"(?:,\s*(?:{POSTCODE}(?:\s+{CITY})?|{CITY}(?:,?\s+{POSTCODE})?)|\s+{POSTCODE}(?:\s+{CITY})?|"
                          rf"[ \t]*\n[ \t]*(?:{CITY}(?:,[ \t]*{CITY})?,?[ \t]+{POSTCODE}|{POSTCODE}[ \t]+{CITY})){_END}")
# Flat, floor and door, as they are written after a street and before it.
UNIT_WORDS = (r"apt|apartment|appt|app|suite|ste|unit|flat|floor|fl|room|rm|piso|puerta|pta|planta|escalera|esc|"
              r"étage|etage|bâtiment|batiment|bât|bat|wohnung|whg|interno|int|scala|#")
UNIT = (rf"(?:(?<![\w])(?:{UNIT_WORDS})\.?[ \t]*(?:n[º°o]\.?[ \t]*)?#?[ \t]*[A-Za-z0-9][\w/-]{{0,5}}"
        r"|\d{1,3}[ \t]?[º°ª](?:[ \t]?\d{1,2}[º°ª]|[ \t]?[A-Za-z](?![\w]))?"
        r"|\d{1,2}(?:e|er|ère|ème|eme|st|nd|rd|th)[ \t]+(?:étage|etage|floor)|\d{1,2}\.[ \t]?(?:OG|Stock|Etage))")
UNIT_SEGMENT = re.compile(rf"(?:,[ \t]*|[ \t]+)(?i:{UNIT})(?=[\s,.;!?)]|$)")
# Before the street the unit may have its number, or share the street's ("Unit 5/12 Smith St").
LEAD_UNIT = re.compile(rf"(?i:{UNIT}|(?<![\w])(?:{UNIT_WORDS})\.?)[ \t]*,?[ \t]*\Z")
ADDRESS_CUE = re.compile(
    r"\b(?:my\s+(?:new\s+|home\s+|old\s+|current\s+|billing\s+|shipping\s+|delivery\s+|postal\s+|mailing\s+)?"
    r"address\s*(?:is|:)|(?:home|billing|shipping|delivery|postal|mailing|street|new)\s+address\s*(?:is|:)|"
    r"address\s*:|i\s+live\s+(?:at|on|in)|i'm\s+at|i\s+moved\s+to|we\s+moved\s+to|ship(?:ping)?\s+(?:it\s+)?to|"
    r"deliver(?:y|ed)?\s+(?:it\s+)?to|send\s+(?:it|them|the\s+\w+)\s+to|mail\s+(?:it\s+)?to|located\s+at|"
    r"j'habite\s+(?:au|à)|ich\s+wohne\s+in|vivo\s+en|mi\s+dirección\s+es|meine\s+adresse\s+ist|mon\s+adresse\s+est)"
    r"\s*",
    re.IGNORECASE,
)
CLAUSE_END = re.compile(r"(?<!\b[A-Z][a-z])(?<!\bSt)(?<!\bAve)(?<!\bRd)(?<!\bApt)[.!?](?:\s|$)|\n| but | and I | so ")


GATED_STREETS = ((ROMANCE_STREET, ROMANCE_GATE), (GERMANIC_STREET, GERMANIC_HINT), (PO_BOX, PO_BOX_GATE))


def _extend(text: str, end: int, segments: int = 6) -> int:
    """Grow a street's end over its units, postcode, city and state, in whatever order they are written."""
    if text[end - 1] == "." and not text.startswith(",", end):
        return end - 1  # "12 Oak St. Please call": the period ends the sentence too; keep it
    for _ in range(segments):
        m = UNIT_SEGMENT.match(text, end) or TAIL_SEGMENT.match(text, end)
        if m is None:
            break
        end = m.end()
    while end > 0 and text[end - 1] in ".,; ":
        end -= 1
    return end


def _lead(text: str, start: int) -> int:
    """Grow a street's start over a unit written before it: "Flat 2, 15 Elm Grove", "Apt 4B, 100 Main St"."""
    m = LEAD_UNIT.search(text, max(0, start - 32), start)
    return m.start() if m else start


def find_address(text: str) -> Iterator[Span]:
    if not DIGIT.search(text):  # house numbers, postcodes, PO boxes: every form has a digit
        return
    found: list[Span] = []
    low = folded(text)
    for pattern in (NUMBER_FIRST, *(pattern for pattern, gate in GATED_STREETS if gate.search(low))):
        for m in pattern.finditer(text):
            found.append((_lead(text, m.start()), _extend(text, m.end())))
    yield from found
    if not any(w in low for w in ADDRESS_WORDS):
        return
    for m in ADDRESS_CUE.finditer(text):
        start = m.end()
        if any(s <= start + 2 and start - 2 <= e for s, e in found) or any(start <= s < start + 40 for s, _ in found):
            continue
        stop = CLAUSE_END.search(text, start)
        end = min(stop.start() if stop else len(text), start + 120)
        chunk = text[start:end].rstrip(TRAILING + " ")
        # An address has a number (house or postcode) and a capitalised place; "ship it to my office" has neither.
        if re.search(r"\d", chunk) and re.search(r"[A-Z]", chunk) and len(chunk) >= 6:
            yield start, start + len(chunk)
