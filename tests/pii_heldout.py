"""A held-out PII generator, written apart from the detectors (issue 23): seeded sentences with planted values of
each type in several surface forms, and look-alike sentences that hold none.

It differs from mlops.data.labelled_pii in what it scores. Every planted entity is known by its character span,
and it counts as masked only when every character of it lies inside a mask: "2367 [ADDRESS]4 Madrid" or
"Bearer [API_KEY]" are misses, not near hits. A mask that starts or ends inside a token (a digit run or a word
cut in two) is counted apart as a split, whatever its type. Look-alikes (versions, dates, prices, product codes,
"at"/"dot" prose, street names without a number, git hashes) count as false positives if anything in them is
masked at all.

Values are composed from parts (random names, words, digits) rather than taken from a list of examples, and the
frames are not the labelled set's sentences. `heldout_cases(seed)` is deterministic.
"""

from __future__ import annotations

import base64
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field

Entity = tuple[str, int, int, str]  # (type, start, end, surface form)


@dataclass
class Planted:
    text: str
    entities: list[Entity] = field(default_factory=list)
    kind: str = ""  # look-alike family; empty for a message with PII


GIVEN = ["keiko", "tomasz", "ines", "rafael", "amara", "bjorn", "lucia", "dev", "hana", "omar", "greta", "nikolai",
         "sade", "yusuf", "mei", "pavel", "elif", "jonas", "aoife", "kenji", "leila", "marek", "nadia", "teodor"]
FAMILY = ["osullivan", "kowalczyk", "ferreira", "lindqvist", "okafor", "brennan", "yamamoto", "castellano",
          "novak", "haddad", "moreau", "petrovic", "achterberg", "delacroix", "oyelaran", "whitfield", "szabo"]
WORDS = ["northwind", "bluefinch", "corvid", "tallgrass", "quillon", "meridia", "stonebay", "fjordline", "ketter",
         "amberly", "parkway", "rivermoor", "helix", "cobalt", "lumen", "saltmarsh", "orchid", "vantage"]
TLDS = ["com", "org", "net", "io", "de", "fr", "nl", "es", "it", "co.uk", "org.uk", "ac.uk", "com.au", "co.jp",
        "com.br", "ca", "ch", "se", "edu", "info", "dev", "co.nz", "gv.at"]


def _digits(r: random.Random, n: int, first: str = "123456789") -> str:
    return r.choice(first) + "".join(r.choice(string.digits) for _ in range(n - 1))


def _chars(r: random.Random, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(r.choice(alphabet) for _ in range(n))


# --------------------------------------------------------------------------- email, plain and obfuscated

def _local(r: random.Random) -> str:
    g, f = r.choice(GIVEN), r.choice(FAMILY)
    return r.choice([f"{g}.{f}", f"{g[0]}{f}", f"{g}_{f}{r.randint(1, 99)}", f"{f}-{g}", g, f"{g}{r.randint(70, 99)}",
                     f"{g}.{f[0]}", f"{f}.{g}+news"])


def _domain(r: random.Random) -> list[str]:
    labels = [r.choice(WORDS)]
    if r.random() < 0.25:
        labels.insert(0, r.choice(["mail", "dept", "lists", "eu"]))
    return labels + r.choice(TLDS).split(".")


AT_FORMS = [" at ", " AT ", " (at) ", "(at)", " [at] ", "[at]", "{at}", " {at} ", " <at> ", " @ ", "@ ", " At ",
            " [ at ] ", " (AT) ", "[@]", " -at- "]
DOT_FORMS = [" dot ", " DOT ", " (dot) ", "(dot)", " [dot] ", "[dot]", "{dot}", " . ", ".", "[.]", " -dot- "]


def email(r: random.Random) -> tuple[str, str]:
    local, labels = _local(r), _domain(r)
    if r.random() < 0.15:
        local = local.capitalize()
    if r.random() < 0.3:
        return "plain", f"{local}@{'.'.join(labels)}"
    at = r.choice(AT_FORMS)
    # People pick one style and keep it, mostly: "(at)" goes with "(dot)"; a bare " at " often keeps a real dot.
    styled = {" at ": [" dot ", "."], " AT ": [" DOT "], " At ": [" dot "], " @ ": [" . ", "."], "@ ": [" . "],
              "[@]": ["[.]"], " -at- ": [" -dot- ", "."]}
    spelled = re.sub("at", lambda m: "dot" if m.group(0) == "at" else "DOT", at, flags=re.IGNORECASE)
    dot = r.choice(styled.get(at) or [spelled, r.choice(DOT_FORMS)])
    if "." in local and dot.strip() and r.random() < 0.3:
        local = local.replace(".", dot)
    return f"at={at.strip() or 'space'}", f"{local}{at}{dot.join(labels)}"


# --------------------------------------------------------------------------- API keys and tokens

def _jwt(r: random.Random) -> str:
    seg = string.ascii_letters + string.digits + "_-"
    return f"eyJ{_chars(r, r.randint(16, 30), seg)}.eyJ{_chars(r, r.randint(24, 60), seg)}.{_chars(r, 43, seg)}"


def api_key(r: random.Random) -> tuple[str, str, str]:
    hexa = "0123456789abcdef"
    provider = r.choice([
        "ghp_" + _chars(r, 36), "github_pat_" + _chars(r, 22) + "_" + _chars(r, 59), "sk-proj-" + _chars(r, 48),
        "sk-ant-api03-" + _chars(r, 80, string.ascii_letters + string.digits + "_-"), "AKIA" + _chars(r, 16, string.ascii_uppercase + "234567"),
        f"xoxp-{_digits(r, 11)}-{_digits(r, 12)}-{_chars(r, 32, hexa)}", "glpat-" + _chars(r, 20, string.ascii_letters + string.digits + "_-"),
        "AIza" + _chars(r, 35, string.ascii_letters + string.digits + "_-"), "hf_" + _chars(r, 34, string.ascii_letters),
        "npm_" + _chars(r, 36), "rk_live_" + _chars(r, 28), "pk_test_" + _chars(r, 30), _jwt(r),
    ])
    user = r.choice(GIVEN) + r.choice(["", str(r.randint(1, 99))])
    secret = _chars(r, r.randint(8, 14), string.ascii_letters + string.digits + "!$%")
    basic = base64.b64encode(f"{user}:{secret}".encode()).decode()
    opaque = _chars(r, r.choice([32, 40, 48]), r.choice([hexa, string.ascii_letters + string.digits]))
    form, value = r.choice([
        ("provider", provider), ("provider", provider), ("bearer", f"Bearer {r.choice([_jwt(r), opaque])}"),
        ("bearer", f"bearer {opaque}"), ("basic", f"Basic {basic}"), ("token", f"token {r.choice(['ghp_' + _chars(r, 36), opaque])}"),
        ("aws_secret", _chars(r, 40, string.ascii_letters + string.digits + "/+")), ("x_api_key", _chars(r, 32, hexa)),
    ])
    # The name of a setting or a header is the cue, not the secret: it stays outside the entity.
    lead = {"aws_secret": "aws_secret_access_key = ", "x_api_key": "X-Api-Key: "}.get(form, "")
    return form, value, lead


# --------------------------------------------------------------------------- street addresses, whole

STREET_NAMES = ["Larkspur", "Wexford", "Copperfield", "Halloran", "Juniper", "Ashcombe", "Brackenridge", "Tolliver",
                "Marigold", "Fenwick", "Sycamore", "Kingsmere"]
US_CITIES = [("Portland", "OR"), ("Columbus", "OH"), ("Boise", "ID"), ("Raleigh", "NC"), ("Tucson", "AZ"),
             ("Madison", "WI"), ("Albany", "NY")]
UK_CITIES = [("Bristol", "BS1 4DJ"), ("Leeds", "LS2 7EW"), ("Glasgow", "G12 8QQ"), ("Cardiff", "CF10 3AT"),
             ("York", "YO1 7HH"), ("Brighton", "BN1 1EE")]
CA_CITIES = [("Ottawa", "ON", "K1P 5J2"), ("Calgary", "AB", "T2P 1J9"), ("Halifax", "NS", "B3H 4R2")]


def _unit(r: random.Random) -> str:
    return r.choice([f"Apt {r.randint(1, 40)}{r.choice(['', 'B', 'C'])}", f"Apartment {r.randint(2, 90)}",
                     f"Suite {r.randint(100, 950)}", f"Unit {r.randint(1, 30)}", f"#{r.randint(2, 999)}",
                     f"Flat {r.randint(1, 12)}"])


def address(r: random.Random) -> tuple[str, str]:
    n = str(r.randint(1, 4999))
    street = r.choice(STREET_NAMES)
    es = r.choice(["Alcalá", "Serrano", "Velázquez", "la Princesa", "Atocha"])
    city, state = r.choice(US_CITIES)
    zipcode = _digits(r, 5) + (f"-{_digits(r, 4, string.digits)}" if r.random() < 0.4 else "")
    uk_city, uk_pc = r.choice(UK_CITIES)
    ca_city, prov, ca_pc = r.choice(CA_CITIES)
    forms = {
        "us": f"{n} {street} {r.choice(['Street', 'Avenue', 'Road', 'Lane', 'Blvd', 'Drive', 'Ct'])}"
              f"{r.choice(['', ', ' + _unit(r)])}, {city}, {state} {zipcode}",
        "uk": f"{r.choice(['', 'Flat ' + str(r.randint(1, 9)) + ', '])}{n} {street} {r.choice(['Road', 'Close', 'Gardens', 'Terrace', 'Mews'])}, "
              f"{uk_city} {uk_pc}",
        "ca": f"{n} {street} {r.choice(['Street', 'Avenue', 'Crescent'])}{r.choice(['', ', Suite ' + str(r.randint(100, 900))])}, "
              f"{ca_city}, {prov} {ca_pc}",
        "es": r.choice([f"{n} Calle de {es}, 280{r.randint(10, 99)} Madrid",
                        f"Calle {es} {r.randint(1, 199)}, {r.choice(['Piso 3', '2º B', 'piso 4, puerta 2', '1ª'])}, "
                        f"280{r.randint(10, 99)} Madrid",
                        f"Avenida de {es} {r.randint(1, 199)}, 080{r.randint(10, 42)} Barcelona"]),
        "fr": r.choice([f"{n[:3]} Rue de {r.choice(['Rivoli', 'Vaugirard', 'Charonne'])}, Apt {r.randint(1, 60)}, 750{r.randint(10, 20)} Paris",
                        f"{r.randint(1, 99)} bis avenue {r.choice(['Jean Jaurès', 'Foch'])}, 690{r.randint(10, 99)} Lyon",
                        f"{r.randint(1, 99)} boulevard {r.choice(['Longchamp', 'Baille'])}, {r.randint(2, 6)}e étage, 130{r.randint(10, 16)} Marseille"]),
        "de": f"{r.choice(['Linden', 'Birken', 'Kastanien', 'Ahorn'])}{r.choice(['straße', 'weg', 'allee'])} {r.randint(1, 150)}"
              f"{r.choice(['', 'a', 'b'])}, {r.randint(10, 99)}{_digits(r, 3, string.digits)} {r.choice(['Leipzig', 'Dresden', 'Frankfurt am Main', 'Bonn'])}",
        "nl": f"{r.choice(['Keizers', 'Heren', 'Prinsen'])}gracht {r.randint(1, 700)}, {r.randint(1011, 1099)} "
              f"{r.choice(string.ascii_uppercase)}{r.choice('ABCDEGHJKLMNPRSTVWXZ')} Amsterdam",
        "it": f"Via {r.choice(['Torino', 'Mazzini', 'Cavour'])} {r.randint(1, 120)}, 201{r.randint(10, 62)} Milano",
        "two_lines": f"{n} {street} {r.choice(['Street', 'Avenue', 'Road'])}\n{city}, {state} {zipcode}",
        "au": f"{r.choice(['Unit ', ''])}{r.randint(1, 20)}/{r.randint(1, 300)} {street} {r.choice(['St', 'Pde', 'Rd'])}, "
              f"{r.choice(['Richmond', 'Fitzroy', 'Glebe'])} {r.choice(['VIC', 'NSW'])} {r.randint(2000, 3999)}",
        "ie": f"{r.randint(1, 90)} {street} {r.choice(['Road', 'Park', 'Avenue'])}, Dublin {r.choice(['D02 X285', 'D04 C932', 'D6W Y2K1'])}",
        "po_box": f"PO Box {r.randint(10, 9999)}, {city}, {state} {zipcode}",
        "pt_br": r.choice([f"Rua {r.choice(['Augusta', 'das Flores'])} {r.randint(1, 999)}, 1{_digits(r, 3, string.digits)}-{_digits(r, 3, string.digits)} Lisboa",
                           f"Rua {r.choice(['Augusta', 'Oscar Freire'])}, {r.randint(1, 2999)}, 0{_digits(r, 4, string.digits)}-{_digits(r, 3, string.digits)} São Paulo"]),
    }
    form = r.choice(sorted(forms))
    return form, forms[form]


# --------------------------------------------------------------------------- the other types, fewer forms each

def _luhn(body: str) -> str:
    from stdnum import luhn

    return body + luhn.calc_check_digit(body)


def phone(r: random.Random) -> tuple[str, str]:
    a, x, s = _digits(r, 3, "2345678"), _digits(r, 3, "2345678"), _digits(r, 4, string.digits)
    return "phone", r.choice([f"({a}) {x}-{s}", f"+1 {a}.{x}.{s}", f"+44 7{_digits(r, 3)} {_digits(r, 6)}",
                              f"+49 176 {_digits(r, 8)}", f"+33 7 {_digits(r, 2)} {_digits(r, 2)} {_digits(r, 2)} {_digits(r, 2)}",
                              f"{a}-{x}-{s}"])


def credit_card(r: random.Random) -> tuple[str, str]:
    body = r.choice(["4", "51", "53", "6011"])
    digits = _luhn(body + _digits(r, 15 - len(body), string.digits))
    return "card", r.choice([digits, " ".join(digits[i:i + 4] for i in range(0, 16, 4)),
                             "-".join(digits[i:i + 4] for i in range(0, 16, 4))])


def ip_address(r: random.Random) -> tuple[str, str]:
    o = [r.randint(11, 223) for _ in range(4)]
    return "ip", r.choice([".".join(map(str, o)), f"2001:db8:{r.randint(1, 0xfff):x}::{r.randint(1, 0xffff):x}"])


def iban(r: random.Random) -> tuple[str, str]:
    bban = _digits(r, 18, string.digits)
    numeric = bban + "131400"  # DE00
    value = f"DE{98 - int(numeric) % 97:02d}{bban}"
    return "iban", r.choice([value, " ".join(value[i:i + 4] for i in range(0, len(value), 4))])


TYPES: dict[str, tuple[Callable[[random.Random], tuple[str, ...]], list[str]]] = {
    "email": (email, ["drop a line to {v} if anything changes", "{v} is where the receipts go", "Contact (personal): {v}",
                      "you'll find me under {v}, mostly", "forwarding this from {v}; please update the CRM",
                      "Escríbeme a {v} cuando puedas.", "Schreiben Sie bitte an {v}.", "ping {v} or the shared inbox",
                      "(personal: {v})", "the form bounced, so: {v}, or phone", "Anything urgent -> {v}."]),
    "api_key": (api_key, ["the request had Authorization: {v} in it", "curl -H \"Authorization: {v}\" https://x.test/v2",
                          "headers = {{'Authorization': '{v}'}}", "I accidentally pasted {v} into the ticket",
                          "our CI log shows {v} near the top"]),
    "address": (address, ["Send the replacement to {v}.", "We're now at {v} if you need to visit.", "Shipping: {v}",
                          "the invoice lists {v} as the billing address", "new place is {v} - please update",
                          "Lieferung an: {v}", "Mi dirección es {v}.", "Our office: {v}. Open 9-5."]),
    "phone": (phone, ["best to call {v} after lunch", "Mobile: {v}", "my cell is {v}, text first"]),
    "credit_card": (credit_card, ["charge the card {v} again", "Card no: {v}", "used my visa {v} for it"]),
    "ip_address": (ip_address, ["the box at {v} keeps rebooting", "my home IP is {v}"]),
    "iban": (iban, ["wire it to IBAN {v}", "Konto: {v}"]),
}
SETTING_FRAMES = ["in my .env I had {v} before the rotation", "{v}", "the config file says {v}", "it printed {v} to stdout"]
STRUCTURED = ("email", "api_key", "phone", "credit_card", "ip_address", "iban")


# --------------------------------------------------------------------------- look-alikes: no PII at all

def lookalike(r: random.Random) -> tuple[str, str]:
    hexa = "0123456789abcdef"
    street = r.choice(STREET_NAMES)
    kinds = {
        "version": [f"upgraded to {r.randint(1, 9)}.{r.randint(0, 30)}.{r.randint(0, 9)} and it broke",
                    f"release v{r.randint(1, 20)}.{r.randint(0, 9)}.{r.randint(0, 99)}-rc{r.randint(1, 4)} is tagged"],
        "date_price": [f"due on {r.randint(1, 28)} March {r.randint(2020, 2027)}", f"it was ${r.randint(10, 999)}.{_digits(r, 2, string.digits)} at checkout",
                       f"the {r.randint(2019, 2026)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} run failed",
                       f"priced at {r.randint(2, 90)},{r.randint(10, 99)} € per month"],
        "product_code": [f"part {r.choice(string.ascii_uppercase)}{r.choice(string.ascii_uppercase)}-{_digits(r, 4)}-{r.randint(10, 99)} is back-ordered",
                         f"model {r.choice(['QX', 'TR', 'ZB'])}{r.randint(100, 999)} in stock", f"SKU {_digits(r, 6)}-{r.randint(1, 9)}"],
        "at_dot_prose": ["we meet at the harbour dot on nine", "she pointed at the red dot and laughed",
                         "at the end of the day it works", "look at this dot diagram", "the dog sat at the gate",
                         "lunch at 12 then a call at 3", "grab it at the corner shop", "available at example.com and in stores",
                         "I work at northwind.io these days", "see the docs at docs.example.org for details",
                         "find us at bluefinch.de", "I'm at home. Then I leave", "dot the i's and cross the t's at once",
                         "arrived at Gate 12. Boarding soon", "tickets at ticketdesk.com from Monday",
                         "order at shop.example.de before noon", "register at events.example.org today",
                         "the version at 2 dot 1 is old", "I'm at the office dot com bubble era", "stats at a glance. Next"],
        "auth_words": ["bearer bonds were popular", "the Basic plan costs less", "a token gesture, nothing more",
                       "the token expired at midnight", "Authorization: pending review", "basic authentication is disabled"],
        "street_no_number": [f"walk down {street} Street to the square", f"the {street} Road shops close early",
                             "Rue de Rivoli is busy on Sundays", f"turn left onto {street} Avenue", "Calle Mayor was closed"],
        "git_hash": [f"fixed in commit {_chars(r, 40, hexa)}", f"git checkout {_chars(r, 7, hexa)} first",
                     f"cherry-pick {_chars(r, 12, hexa)} onto main", f"sha256 {_chars(r, 64, hexa)} matches"],
        "numbers": [f"we shipped {r.randint(2, 40)} units to {r.randint(2, 9)} stores", f"room {r.randint(100, 999)}, floor {r.randint(2, 9)}",
                    f"page {r.randint(2, 300)} of the manual", f"{r.randint(2, 12)} Great Ideas for the weekend"],
    }
    kind = r.choice(sorted(kinds))
    return kind, r.choice(kinds[kind])


def _plant(r: random.Random, kind: str) -> Planted:
    gen, frames = TYPES[kind]
    form, value, *lead = gen(r)
    frame = r.choice(SETTING_FRAMES if lead and lead[0] else frames)
    head, tail = frame.split("{v}")
    head, tail = head.replace("{{", "{").replace("}}", "}") + "".join(lead), tail.replace("{{", "{").replace("}}", "}")
    return Planted(head + value + tail, [(kind, len(head), len(head) + len(value), form)])


def heldout_cases(seed: int = 23, per_type: int = 200, lookalikes: int = 500) -> list[Planted]:
    r = random.Random(seed)
    cases = [_plant(r, kind) for kind in TYPES for _ in range(per_type)]
    for _ in range(per_type // 2):  # two values in one message, as people write them
        a, b = r.sample(cases[: len(TYPES) * per_type], 2)
        shift = len(a.text) + 1
        cases.append(Planted(f"{a.text} {b.text}", a.entities + [(k, s + shift, e + shift, f) for k, s, e, f in b.entities]))
    cases += [Planted(text, [], kind) for kind, text in (lookalike(r) for _ in range(lookalikes))]
    return cases


def _joined(c: str) -> bool:
    return c.isalnum() and not ("\u3040" <= c <= "\u9fff" or "\uac00" <= c <= "\ud7af" or "\uff00" <= c <= "\uffef")


def full_mask_score(cases: list[Planted], spans: Callable[[str], list[tuple[int, int, str]]]) -> dict:
    """Per type: the share of entities with every character inside a mask (`full`), inside a mask of its own type
    (`typed`), touched but not covered (`partial`); per form the same `full`; masks that end inside a token with
    its rest unmasked (`splits`);
    and the share of look-alikes with any mask."""
    rows: dict[str, list[int]] = {}
    forms: dict[str, list[int]] = {}
    fp: dict[str, list[int]] = {}
    splits = 0
    for case in cases:
        found = spans(case.text)
        t = case.text
        masked = {i for s, e, _ in found for i in range(s, e)}
        splits += sum((s > 0 and s - 1 not in masked and _joined(t[s - 1]) and _joined(t[s]))
                      or (e < len(t) and e not in masked and _joined(t[e - 1]) and _joined(t[e])) for s, e, _ in found)
        if not case.entities:
            row = fp.setdefault(case.kind, [0, 0])
            row[0] += bool(found)
            row[1] += 1
            continue
        for kind, s, e, form in case.entities:
            covered = [False] * (e - s)
            typed = [False] * (e - s)
            for ms, me, name in found:
                for i in range(max(s, ms), min(e, me)):
                    covered[i - s] = True
                    typed[i - s] = typed[i - s] or name == kind
            row = rows.setdefault(kind, [0, 0, 0, 0])
            row[0] += all(covered)
            row[1] += all(typed)
            row[2] += any(covered) and not all(covered)
            row[3] += 1
            f = forms.setdefault(f"{kind}/{form}", [0, 0])
            f[0] += all(covered)
            f[1] += 1
    n_look = sum(v[1] for v in fp.values())
    return {
        "recall": {k: {"full": a / n, "typed": b / n, "partial": p / n, "n": n} for k, (a, b, p, n) in sorted(rows.items())},
        "by_form": {k: a / n for k, (a, n) in sorted(forms.items())},
        "splits": splits,
        "lookalikes": n_look,
        "lookalike_fp": sum(v[0] for v in fp.values()) / max(1, n_look),
        "lookalike_fp_by_kind": {k: a / n for k, (a, n) in sorted(fp.items())},
    }
