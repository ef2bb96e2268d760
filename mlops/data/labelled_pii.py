"""A labelled PII set for measuring the scrubber: every PII value it plants is known, and look-alikes (order,
ticket and tracking numbers, spaced thousands, firmware versions, dates, amounts, sentences that merely
mention a password or greet someone) carry no PII at all.

Values are drawn per type in many real-world formats (phones in US, UK, German, French, Chinese, Indian,
Australian and Japanese forms; cards with spaces, dashes, dots or none; SSNs with or without dashes; emails
with non-ASCII parts; IPv4-mapped IPv6; ...), digits are random, and each value sits in one of several
sentences. `pii_cases(seed)` is deterministic; `benchmarks/bench_data.py` prints recall per type and the
look-alike false-positive rate, and tests hold the goals.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass, field


@dataclass
class Case:
    text: str
    values: list[tuple[str, str]] = field(default_factory=list)  # (type, planted value); empty for a look-alike
    kind: str = ""  # look-alike family, for the report


def _d(r: random.Random, n: int, first: str = "0123456789") -> str:
    return r.choice(first) + "".join(r.choice(string.digits) for _ in range(n - 1))


# --------------------------------------------------------------------------- values per type

def email(r: random.Random) -> str:
    first = r.choice(["jane", "j.doe", "mike_92", "anna-lena", "o.brien", "wei.zhang", "priya", "T.Nguyen", "ALEX",
                      "josé.garcía", "müller", "zoë", "søren", "用户", "иван.петров", "françois", "info+billing"])
    tail = r.choice(["", str(r.randint(1, 99)), "+shop", ".work"])
    domain = r.choice(["example.com", "mail.example.co.uk", "gmail.com", "outlook.de", "company.io", "uni-hamburg.de",
                       "bücher.de", "correo.es", "пример.рф", "例子.中国", "sub.domain.org", "yahoo.fr", "web.de"])
    value = f"{first}{tail}@{domain}"
    return value if r.random() > 0.07 else value.replace("@", " [at] ", 1).replace(".", " [dot] ", 1)


def phone(r: random.Random) -> str:
    a, x = _d(r, 3, "23456789"), _d(r, 3, "23456789")
    s = _d(r, 4)
    forms = [
        f"({a}) {x}-{s}", f"{a}-{x}-{s}", f"{a}.{x}.{s}", f"{a} {x} {s}", f"+1 {a} {x} {s}", f"+1-{a}-{x}-{s}",
        f"1-800-{x}-{s}", f"1 (888) {x}-{s}", f"{a}{x}{s}", f"+1{a}{x}{s}", f"({a}){x}-{s}", f"{a}-{x}-{s} ext. 2{_d(r, 2)}",
        f"020 {_d(r, 4, '3789')} {_d(r, 4)}", f"+44 20 {_d(r, 4, '3789')} {_d(r, 4)}", f"07{_d(r, 3, '1234579')} {_d(r, 6)}",
        f"+44 7{_d(r, 3, '1234579')} {_d(r, 6)}", f"(0161) {_d(r, 3, '23456789')} {_d(r, 4)}",
        f"030 {_d(r, 8, '23456789')}", f"+49 30 {_d(r, 8, '23456789')}", f"015{_d(r, 1, '12579')} {_d(r, 8)}",
        f"+49 151 {_d(r, 8)}", f"089 {_d(r, 4, '2345678')} {_d(r, 4)}", f"030/{_d(r, 7, '23456789')}",
        f"01 {_d(r, 2)} {_d(r, 2)} {_d(r, 2)} {_d(r, 2)}", f"06 {_d(r, 2)} {_d(r, 2)} {_d(r, 2)} {_d(r, 2)}",
        f"+33 6 {_d(r, 2)} {_d(r, 2)} {_d(r, 2)} {_d(r, 2)}", f"06.{_d(r, 2)}.{_d(r, 2)}.{_d(r, 2)}.{_d(r, 2)}",
        f"+33 (0)1 {_d(r, 2)} {_d(r, 2)} {_d(r, 2)} {_d(r, 2)}",
        f"13{_d(r, 1, '5789')} {_d(r, 4)} {_d(r, 4)}", f"13{_d(r, 1, '5789')}{_d(r, 8)}", f"+86 13{_d(r, 1, '5789')} {_d(r, 4)} {_d(r, 4)}",
        f"010-{_d(r, 8, '5678')}", f"+86 10 {_d(r, 4, '5678')} {_d(r, 4)}",
        f"9{_d(r, 4)} {_d(r, 5)}", f"+91 9{_d(r, 4)} {_d(r, 5)}", f"+91-9{_d(r, 9)}", f"09{_d(r, 9)}",
        f"022 {_d(r, 4, '2346')} {_d(r, 4)}",
        f"(02) 9{_d(r, 3)} {_d(r, 4)}", f"04{_d(r, 2)} {_d(r, 3)} {_d(r, 3)}", f"+61 4{_d(r, 2)} {_d(r, 3)} {_d(r, 3)}",
        f"+61 2 9{_d(r, 3)} {_d(r, 4)}", f"04{_d(r, 8)}",
        f"03-{_d(r, 4, '123456789')}-{_d(r, 4)}", f"090-{_d(r, 4, '123456789')}-{_d(r, 4)}",
        f"+81 3-{_d(r, 4, '123456789')}-{_d(r, 4)}", f"+81 90 {_d(r, 4, '123456789')} {_d(r, 4)}",
        f"06-{_d(r, 4, '123456789')}-{_d(r, 4)}",
    ]
    return r.choice(forms)


def _luhn_complete(body: str) -> str:
    from stdnum import luhn

    return body + luhn.calc_check_digit(body)


def credit_card(r: random.Random) -> str:
    prefix, length, groups = r.choice([
        ("4", 16, (4, 4, 4, 4)), ("5" + r.choice("12345"), 16, (4, 4, 4, 4)), ("2" + str(r.randint(221, 720)), 16, (4, 4, 4, 4)),
        ("3" + r.choice("47"), 15, (4, 6, 5)), ("6011", 16, (4, 4, 4, 4)), ("35" + str(r.randint(28, 89)), 16, (4, 4, 4, 4)),
        ("36", 14, (4, 6, 4)), ("62", 16, (4, 4, 4, 4)), ("4", 13, (4, 4, 5)),
    ])
    digits = _luhn_complete(prefix + _d(r, length - len(prefix) - 1))
    sep = r.choice(["", " ", "-", ".", " "])
    if not sep:
        return digits
    out, pos = [], 0
    for g in groups:
        out.append(digits[pos : pos + g])
        pos += g
    return sep.join(out)


def national_id(r: random.Random) -> tuple[str, str]:
    """(value, form) so the sentence can give the cue a bare number needs."""
    area, group, serial = _d(r, 3, "12345678"), f"{r.randint(1, 99):02d}", f"{r.randint(1, 9999):04d}"
    form = r.choice(["dash", "dash", "space", "bare", "nino"])
    if form == "nino":
        return f"{r.choice('ACEHJKLMPRSW')}{r.choice('ABCEHJKLMNPRSTW')} {_d(r, 2)} {_d(r, 2)} {_d(r, 2)} {r.choice('ABCD')}", form
    return {"dash": f"{area}-{group}-{serial}", "space": f"{area} {group} {serial}", "bare": f"{area}{group}{serial}"}[form], form


IBAN_FORMATS = {"DE": "n18", "GB": "a4n14", "NL": "a4n10", "FR": "n10a11n2", "ES": "n20", "IT": "a1n10c12",
                "AT": "n16", "CH": "n17", "BE": "n12", "PL": "n24", "IE": "a4n14"}


def iban(r: random.Random) -> str:
    country = r.choice(sorted(IBAN_FORMATS))
    spec = IBAN_FORMATS[country]
    parts = []
    i = 0
    while i < len(spec):
        kind = spec[i]
        j = i + 1
        while j < len(spec) and spec[j].isdigit():
            j += 1
        n = int(spec[i + 1 : j])
        alphabet = {"n": string.digits, "a": string.ascii_uppercase, "c": string.ascii_uppercase + string.digits}[kind]
        parts.append("".join(r.choice(alphabet) for _ in range(n)))
        i = j
    bban = "".join(parts)
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    check = 98 - int(numeric) % 97
    value = f"{country}{check:02d}{bban}"
    return " ".join(value[k : k + 4] for k in range(0, len(value), 4)) if r.random() < 0.6 else value


def ip_address(r: random.Random) -> str:
    o = [r.randint(1, 254) for _ in range(4)]
    h = [f"{r.randint(0, 0xffff):x}" for _ in range(8)]
    return r.choice([
        ".".join(map(str, o)), f"192.168.{o[1]}.{o[2]}", f"10.{o[1]}.{o[2]}.{o[3]}", f"{'.'.join(map(str, o))}:8080",
        ":".join(h), f"2001:db8::{h[0]}:{h[1]}", f"fe80::{h[2]}:{h[3]}%eth0", f"::ffff:{'.'.join(map(str, o))}",
        f"::ffff:192.0.2.{o[3]}", f"[2001:db8::{h[4]}]:443", f"{'.'.join(map(str, o))}/24", "::1" if r.random() < 0.1
        else f"2a02:{h[5]}:{h[6]}::{h[7]}",
    ])


def _rand(r: random.Random, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(r.choice(alphabet) for _ in range(n))


def api_key(r: random.Random) -> str:
    jwt = f"eyJ{_rand(r, 20)}.eyJ{_rand(r, 30)}.{_rand(r, 43, string.ascii_letters + string.digits + '_-')}"
    return r.choice([
        "AKIA" + _rand(r, 16, string.ascii_uppercase + string.digits), "ghp_" + _rand(r, 36),
        f"xoxb-{_d(r, 12)}-{_d(r, 13)}-{_rand(r, 24)}", "sk_live_" + _rand(r, 24), "sk-proj-" + _rand(r, 40),
        "AIza" + _rand(r, 35, string.ascii_letters + string.digits + "_-"), jwt, "hf_" + _rand(r, 34, string.ascii_letters),
        f"SG.{_rand(r, 22)}.{_rand(r, 43)}", "glpat-" + _rand(r, 20), _rand(r, 32, "0123456789abcdef"), _rand(r, 40),
    ])


def password(r: random.Random) -> str:
    return r.choice(["hunter2", "Tr0ub4dor&3", "sunflower22", "P@ssw0rd!", "correcthorsebatterystaple", "qwerty123",
                     "S3cr3t-Pa55", "letmein2024", "Blue$ky77", "m0nkey!", "Winter2023", "dragon_fly9", "Zx9#kLm2",
                     "ilovemycat", "Passwort123", "azerty01", str(r.randint(1000, 999999)) + "ab"])


FIRST = ["John", "María", "Wei", "Priya", "Olumide", "Siobhán", "Jürgen", "Ana", "Mohammed", "Yuki", "Lars", "Fatima",
         "Carlos", "Emily", "Dmitri", "Chloé", "Aarav", "Kwame", "Ingrid", "Hiroshi", "Sofia", "Liam", "Noura", "Pedro"]
LAST = ["Smith", "García", "Zhang", "Sharma", "Adeyemi", "O'Brien", "Müller", "de la Cruz", "Al-Farsi", "Tanaka",
        "Johansson", "Haddad", "Mendoza", "Clarke", "Ivanov", "Dubois", "Patel", "Mensah", "Larsen", "Sato", "Rossi",
        "Murphy", "Nguyen", "van der Berg"]


def name(r: random.Random) -> str:
    value = r.choice([f"{r.choice(FIRST)} {r.choice(LAST)}", r.choice(FIRST), f"{r.choice(FIRST)} {r.choice(LAST)}"])
    return value.lower() if r.random() < 0.08 else value


STREETS = ["Baker", "Main", "Oak", "Maple", "Pennsylvania", "Evergreen", "Elm", "Queen's", "Church", "High", "Park",
           "Sunset", "Wallaby", "Victoria", "King", "Mill", "Station", "Lake"]
SUFFIXES = ["Street", "St", "Avenue", "Ave", "Road", "Rd", "Lane", "Drive", "Way", "Boulevard", "Terrace", "Close",
            "Court", "Place"]
CITIES = [("Springfield", "IL 62704"), ("London", "NW1 6XE"), ("New York", "NY 10118"), ("Sydney", "NSW 2000"),
          ("Manchester", "M1 1AE"), ("Austin", "TX 78701"), ("Toronto", "ON M5V 2T6"), ("Dublin", "D02 X285")]


def address(r: random.Random) -> str:
    city, code = r.choice(CITIES)
    house = f"{r.randint(1, 9999)}{r.choice(['', '', 'B', 'a'])}"
    return r.choice([
        f"{house} {r.choice(STREETS)} {r.choice(SUFFIXES)}, {city}, {code}", f"{house} {r.choice(STREETS)} {r.choice(SUFFIXES)}",
        f"{house} {r.choice(STREETS)} {r.choice(SUFFIXES)}, Apt {r.randint(1, 40)}{r.choice('ABC')}, {city} {code}",
        f"{r.choice(['Haupt', 'Bahnhof', 'Goethe', 'Linden', 'Schiller'])}{r.choice(['straße', 'strasse', 'weg', 'platz'])} "
        f"{r.randint(1, 180)}, {r.randint(10000, 99999)} {r.choice(['Berlin', 'München', 'Hamburg', 'Köln'])}",
        f"{r.randint(1, 120)} rue {r.choice(['de la Paix', 'Victor Hugo', 'du Faubourg Saint-Honoré', 'Lepic'])}, "
        f"{r.randint(75001, 75020)} Paris",
        f"Calle {r.choice(['Mayor', 'de Alcalá', 'Gran Vía'])} {r.randint(1, 200)}, {r.randint(28001, 28080)} Madrid",
        f"Via {r.choice(['Roma', 'Garibaldi', 'dei Mille'])} {r.randint(1, 90)}, {r.randint(10, 99)}100 Milano",
        f"PO Box {r.randint(100, 99999)}",
    ])


MONTH_NAMES = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
               "November", "December"]


def date_of_birth(r: random.Random) -> str:
    y, m, d = r.randint(1940, 2006), r.randint(1, 12), r.randint(1, 28)
    month = MONTH_NAMES[m - 1]
    return r.choice([f"{d:02d}/{m:02d}/{y}", f"{m}/{d}/{y}", f"{y}-{m:02d}-{d:02d}", f"{d:02d}.{m:02d}.{y}",
                     f"{month} {d}, {y}", f"{d} {month} {y}", f"{d}th of {month}, {y}", f"{month[:3]} {d} {y}",
                     f"{d:02d}-{m:02d}-{y}"])


# --------------------------------------------------------------------------- sentences

SENTENCES = {
    "email": ["You can email me at {v}.", "my email is {v}", "Contact: {v}", "please send the invoice to {v} thanks",
              "({v})", "reply to <{v}>", "email:{v}", "{v} is my work address", "Ich bin unter {v} erreichbar.",
              "My old address {v} no longer works, use the new one."],
    "phone": ["call me at {v}", "my number is {v}", "You can reach me on {v} after 5pm.", "Phone: {v}",
              "my mobile {v} is the best way", "text {v} when the technician is close", "{v} is my cell",
              "Ring me on {v} tomorrow morning.", "contact number {v}", "or try {v}, that is my wife's phone",
              "Tel. {v}", "WhatsApp: {v}", "Meine Nummer ist {v}.", "mon portable : {v}", "I'm on {v} all day."],
    "credit_card": ["my card is {v}", "card number {v} exp 09/27", "please charge {v} for the upgrade", "paid with {v}",
                    "Visa {v}, CVV on the back", "{v} is the card on file", "the number on my card: {v}",
                    "I used {v} for the order but it was declined."],
    "iban": ["IBAN: {v}", "please refund to {v}", "my bank account is {v}", "Send the money to IBAN {v} please.",
             "{v} (that's my new account)", "Überweisung bitte auf {v}."],
    "ip_address": ["my IP is {v}", "server {v} is down", "connect to {v} and try again", "requests from {v} time out",
                   "ping {v} fails", "the gateway is {v}", "I'm connecting from {v} at home", "blocked address {v}"],
    "api_key": ["my API key is {v}", "here is the token {v}", "Authorization: Bearer {v}", "api_key={v}",
                "the secret key: {v}", "export TOKEN={v}", "I pasted my access token {v} in the chat, oops",
                "curl -H 'X-API-Key: {v}' https://api.example.com"],
    "password": ["my password is {v}", "password: {v}", "the wifi password is '{v}'", "I set my password to {v} yesterday",
                 "pwd={v}", "my new password will be {v}", "The password for my account is {v}.", "login bob, password {v}",
                 "Mein Passwort ist {v}.", "passcode: {v}"],
    "name": ["my name is {v}", "My name's {v} and I have a billing question.", "Hi, this is {v} from the accounts team.",
             "Name: {v}", "Thanks,\n{v}", "Regards, {v}", "Hello {v}, thanks for reaching out.",
             "the account holder is {v}", "Dear {v},\nthank you for your patience.", "I'm {v}, I called yesterday.",
             "je m'appelle {v}", "Ich heiße {v}.", "me llamo {v} y tengo un problema", "call me {v}"],
    "address": ["I live at {v}.", "my address is {v}", "please ship it to {v}", "deliver to {v} before Friday",
                "Address: {v}", "My new address is {v}, from next month.", "We moved to {v} last week.",
                "The parcel went to {v} instead of my flat."],
    "date_of_birth": ["my date of birth is {v}", "DOB: {v}", "I was born on {v}.", "birthday: {v}",
                      "date of birth {v}, if you need it", "D.O.B. {v}", "born {v} in Leeds", "Geburtsdatum: {v}"],
}
SSN_SENTENCES = {"dash": ["my SSN is {v}", "SSN: {v}", "for the tax form, my number is {v}", "{v} is my social"],
                 "space": ["SSN {v}", "social security number {v}"],
                 "bare": ["my SSN is {v}", "social security number: {v}", "SSN#{v}", "my social security no. is {v}"],
                 "nino": ["NI number {v} please", "National Insurance: {v}"]}
GENERATORS = {"email": email, "phone": phone, "credit_card": credit_card, "iban": iban, "ip_address": ip_address,
              "api_key": api_key, "password": password, "name": name, "address": address, "date_of_birth": date_of_birth}
CUED = ("password", "name", "address", "date_of_birth")

# --------------------------------------------------------------------------- look-alikes (no PII)


def lookalike(r: random.Random) -> tuple[str, str]:
    """(kind, text) of a sentence that holds none of the PII types but looks like one."""
    L = string.ascii_uppercase
    g4 = lambda: _d(r, 4)  # noqa: E731
    track16 = _luhn_complete("4" + _d(r, 14))
    kinds = {
        "order_letter_prefix": [f"Order ORD-{g4()}-{g4()}-{_d(r, 2)} has shipped.", f"order #{r.choice(L)}{_d(r, 1)}F3-{_d(r, 3)} is open",
                                f"reference {r.choice(L)}{r.choice(L)}-{_d(r, 3)}-{_d(r, 3)}-{g4()}",
                                f"ticket TKT-{r.randint(2019, 2026)}-{_d(r, 3)}-{g4()} was closed",
                                f"invoice INV-{r.randint(2019, 2026)}{_d(r, 4)}-{g4()} is attached",
                                f"case CS-{_d(r, 3, '23456789')}-{_d(r, 3, '23456789')}-{g4()} escalated",
                                f"Your order number is A{_d(r, 9)}.", f"order {r.choice(L)}{r.choice(L)}{_d(r, 8)} was refunded"],
        "order_grouped_digits": [f"order number {g4()} {g4()} {g4()}", f"order {r.randint(2019, 2026)} {g4()} {g4()} is late",
                                 f"your order no. {g4()} {g4()} {g4()} is on its way", f"confirmation {g4()}-{g4()}-{g4()}",
                                 f"booking reference {_d(r, 3)} {_d(r, 3)} {_d(r, 4)}", f"Order #{_d(r, 10)} shipped today",
                                 f"account number {_d(r, 8)} shows the wrong plan", f"ticket {_d(r, 3)}-{_d(r, 3)}-{g4()} is open"],
        "spaced_thousands": [f"we have {r.randint(1, 9)} {_d(r, 3)} {_d(r, 3)} customers", f"a budget of {r.randint(10, 99)} {_d(r, 3)} {_d(r, 3)} euros",
                             f"population {r.randint(1, 9)} {_d(r, 3)} {_d(r, 3)}", f"{r.randint(100, 999)} {_d(r, 3)} {_d(r, 3)} units sold",
                             f"{r.randint(10, 99)}.{_d(r, 3)}.{_d(r, 3)} downloads last year", f"revenue was $ {r.randint(1, 9)} {_d(r, 3)} {_d(r, 3)}",
                             f"{r.randint(1, 9)},{_d(r, 3)},{_d(r, 3)} page views"],
        "firmware_version": [f"firmware {r.randint(1, 9)}.{r.randint(0, 9)}.{r.randint(0, 30)}.{r.randint(0, 99)}",
                             f"version {r.randint(1, 12)}.0.{r.randint(10000, 22000)}.{r.randint(1, 999)}",
                             f"updated to {r.randint(1, 9)}.{r.randint(0, 9)}.{r.randint(0, 9)}.{r.randint(0, 40)} last night",
                             f"build {r.randint(1, 9)}.{r.randint(0, 9)}.{r.randint(0, 9)}.{r.randint(0, 9)} crashes",
                             f"v{r.randint(1, 9)}.{r.randint(0, 9)}.{r.randint(0, 9)}.{r.randint(0, 9)} fixed it",
                             f"the router runs firmware version {r.randint(1, 9)}.{r.randint(0, 20)}.{r.randint(0, 9)}.{r.randint(0, 99)}",
                             f"app version {r.randint(1, 9)}.{r.randint(0, 20)}.{r.randint(0, 9)} is out"],
        "tracking_number": [f"tracking number 1Z{_rand(r, 6, L + string.digits)}{_d(r, 10)}",
                            f"tracking {g4()} {g4()} {g4()} {g4()} {g4()} {_d(r, 2)}", f"tracking number {track16}",
                            f"parcel {' '.join(track16[i:i + 4] for i in range(0, 16, 4))} arrived damaged",
                            f"FedEx tracking {_d(r, 12)}", f"DHL shipment {_d(r, 10)} is delayed",
                            f"Royal Mail {r.choice(L)}{r.choice(L)}{_d(r, 9)}GB", f"consignment {_d(r, 18)}"],
        "date_time_amount": [f"on {r.randint(2019, 2026)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
                             f"the {r.randint(1, 12):02d}/{r.randint(1, 28):02d}/{r.randint(2019, 2026)} invoice",
                             f"at {r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}",
                             f"total ${r.randint(1, 9)},{_d(r, 3)}.{_d(r, 2)}", f"€ {r.randint(1, 9)}.{_d(r, 3)},{_d(r, 2)}",
                             f"open Mon-Fri {r.randint(7, 10)}:00-{r.randint(16, 20)}:00",
                             f"order placed on {r.randint(1, 28):02d}/{r.randint(1, 12):02d}/{r.randint(2019, 2026)}"],
        "codes": [f"SKU {_d(r, 3)}-{_d(r, 3)}-{_d(r, 3)}", f"ISBN 978-{r.randint(0, 9)}-{_d(r, 2)}-{_d(r, 6)}-{r.randint(0, 9)}",
                  f"model XR-{_d(r, 4)}", f"flight BA {_d(r, 4)}", f"room {_d(r, 3)}", f"IMEI {_d(r, 15)}",
                  f"serial number SN{_d(r, 10)}", f"error code 0x{_rand(r, 8, '0123456789ABCDEF')}",
                  f"promo code SAVE{_d(r, 2)}NOW", f"part no. {_d(r, 3)}.{_d(r, 3)}.{_d(r, 2)}"],
        "cue_without_pii": ["my password is not working", "the password is incorrect, it says", "my password was reset twice",
                            "Hi there, can you help?", "I'm sorry to hear that.", "This is urgent!", "Thanks, that worked!",
                            "Hello again, it still fails.", "I'm still waiting for the refund.", "my name is on the account",
                            "Dear customer, your ticket is closed.", "Regards, the support team",
                            "I need to change the delivery address", "born and raised here, never had this issue",
                            "my address is the same as before", "the token expired yesterday", "the API key field is empty"],
    }
    kind = r.choice(sorted(kinds))
    return kind, r.choice(kinds[kind])


def pii_cases(seed: int = 15, per_type: int = 120, lookalikes: int = 600) -> list[Case]:
    r = random.Random(seed)
    cases: list[Case] = []
    for kind, gen in GENERATORS.items():
        for _ in range(per_type):
            value = gen(r)
            cases.append(Case(r.choice(SENTENCES[kind]).format(v=value), [(kind, value)]))
    for _ in range(per_type):
        value, form = national_id(r)
        cases.append(Case(r.choice(SSN_SENTENCES[form]).format(v=value), [("national_id", value)]))
    # Several values in one message, as people write them.
    singles = [c for c in cases if c.values]
    for _ in range(per_type):
        picked = r.sample(singles, 3)
        cases.append(Case(" ".join(c.text for c in picked), [v for c in picked for v in c.values]))
    for _ in range(lookalikes):
        kind, text = lookalike(r)
        cases.append(Case(text, [], kind))
    return cases


def score(cases: list[Case], scrub) -> dict:
    """Recall per type (the planted value no longer appears: masked by any placeholder, and by its own) and the
    share of look-alikes changed at all."""
    hits: dict[str, list[int]] = {}
    lookalike_fp: dict[str, list[int]] = {}
    placeholder = {k: f"[{k.upper()}]" for k in (*GENERATORS, "national_id")}
    for case in cases:
        out = scrub(case.text)
        if not case.values:
            lookalike_fp.setdefault(case.kind, [0, 0])
            lookalike_fp[case.kind][0] += out != case.text
            lookalike_fp[case.kind][1] += 1
            continue
        for kind, value in case.values:
            row = hits.setdefault(kind, [0, 0, 0])
            masked = value not in out and not _leaks(value, out)
            row[0] += masked
            row[1] += masked and placeholder[kind] in out
            row[2] += 1
    recall = {k: {"masked": m / n, "typed": t / n, "n": n} for k, (m, t, n) in sorted(hits.items())}
    fp_total = sum(v[0] for v in lookalike_fp.values())
    n_look = sum(v[1] for v in lookalike_fp.values())
    return {"recall": recall, "lookalike_fp": fp_total / max(1, n_look), "lookalikes": n_look,
            "lookalike_fp_by_kind": {k: v[0] / v[1] for k, v in sorted(lookalike_fp.items())}}


def _leaks(value: str, out: str) -> bool:
    """Partial masking leaks too: any part of the value (a word of 5+ letters, or 4+ characters with a digit)
    still standing as a word of the output."""
    words = set(re.findall(r"\w+", out))
    return any((len(p) >= 4 and any(c.isdigit() for c in p)) or len(p) >= 5 for p in re.findall(r"\w+", value)
               if p in words)


# --------------------------------------------------------------------------- hand-written, not from the templates

HANDWRITTEN: list[tuple[str, list[tuple[str, str]]]] = [
    ("hey can u call me back on 917 555 2368 asap", [("phone", "917 555 2368")]),
    ("Best number is +44 (0) 7911 123456, evenings only.", [("phone", "+44 (0) 7911 123456")]),
    ("Sie erreichen mich unter 0171 2345678 oder per Mail.", [("phone", "0171 2345678")]),
    ("mon numéro c'est le 07 81 23 45 67 merci", [("phone", "07 81 23 45 67")]),
    ("请打我电话 139 1234 5678", [("phone", "139 1234 5678")]),
    ("My husband's number (+91) 98450 12345 is also on the account.", [("phone", "98450 12345")]),
    ("Landline: (03) 9123 4567, mobile 0421 555 019", [("phone", "(03) 9123 4567"), ("phone", "0421 555 019")]),
    ("携帯は080-1234-5678です", [("phone", "080-1234-5678")]),
    ("Call our toll free line? No, call ME: 1.800.555.0123", [("phone", "1.800.555.0123")]),
    ("whatsapp me +34 612 345 678", [("phone", "+34 612 345 678")]),
    ("tel +31 20 123 4567 (office)", [("phone", "+31 20 123 4567")]),
    ("You can text 2025550147 any time.", [("phone", "2025550147")]),
    ("my email's Chris.Evans1984@Gmail.com fyi", [("email", "Chris.Evans1984@Gmail.com")]),
    ("send to ça.va@exemple.fr or to the shared inbox", [("email", "ça.va@exemple.fr")]),
    ("Kontakt: jürgen.weiß@müller-gmbh.de", [("email", "jürgen.weiß@müller-gmbh.de")]),
    ("my work one is a.b-c_d@dept.example.ac.uk and personal is zz9@x.io",
     [("email", "a.b-c_d@dept.example.ac.uk"), ("email", "zz9@x.io")]),
    ("email me: tanaka.hiro (at) example (dot) jp", [("email", "tanaka.hiro (at) example (dot) jp")]),
    ("The card ending... actually the full one is 4532 0151 1283 0366.", [("credit_card", "4532 0151 1283 0366")]),
    ("amex 3782 822463 10005 exp 11/26", [("credit_card", "3782 822463 10005")]),
    ("try 5555-5555-5555-4444 instead", [("credit_card", "5555-5555-5555-4444")]),
    ("I typed 6011.1111.1111.1117 in the form", [("credit_card", "6011.1111.1111.1117")]),
    ("cc: 4012888888881881", [("credit_card", "4012888888881881")]),
    ("SSN is 078-05-1121 and DOB is 1/2/1980", [("national_id", "078-05-1121"), ("date_of_birth", "1/2/1980")]),
    ("social: 219 09 9998", [("national_id", "219 09 9998")]),
    ("my ssn 512345678, please keep it private", [("national_id", "512345678")]),
    ("passport number X12345678 expires next year", [("national_id", "X12345678")]),
    ("IBAN GB82 WEST 1234 5698 7654 32 (Barclays)", [("iban", "GB82 WEST 1234 5698 7654 32")]),
    ("refund into DE89370400440532013000 please", [("iban", "DE89370400440532013000")]),
    ("my iban: fr14 2004 1010 0505 0001 3m02 606", [("iban", "fr14 2004 1010 0505 0001 3m02 606")]),
    ("My public IP shows as 203.0.113.77 in the logs", [("ip_address", "203.0.113.77")]),
    ("it resolves to 2001:0db8:0000:0000:0000:ff00:0042:8329", [("ip_address", "2001:0db8:0000:0000:0000:ff00:0042:8329")]),
    ("the mapped address ::ffff:10.20.30.40 appears in the router log", [("ip_address", "::ffff:10.20.30.40")]),
    ("the camera is at 192.168.1.64:554, can't reach it", [("ip_address", "192.168.1.64:554")]),
    ("my key: AKIAJQ4Z5EXAMPLE7XYZ", [("api_key", "AKIAJQ4Z5EXAMPLE7XYZ")]),
    ("header was Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0", [("api_key", "9f8e7d6c5b4a39281706f5e4d3c2b1a0")]),
    ("token=ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", [("api_key", "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789")]),
    ("OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwxYZ0123456789ABCD", [("api_key", "sk-abcdefghijklmnopqrstuvwxYZ0123456789ABCD")]),
    ("pw is Fluffy#2019 don't tell anyone", [("password", "Fluffy#2019")]),
    ("changed my password to bluebird88 but still locked out", [("password", "bluebird88")]),
    ('the router admin password is "admin1234!"', [("password", "admin1234!")]),
    ("PIN is 4921", [("password", "4921")]),
    ("password = Spring2024!", [("password", "Spring2024!")]),
    ("Hi, my name is Grace Hopper and I can't log in.", [("name", "Grace Hopper")]),
    ("This is Tomás Álvarez again about the refund.", [("name", "Tomás Álvarez")]),
    ("Cheers,\nRaj", [("name", "Raj")]),
    ("Kind regards,\nElena Petrova", [("name", "Elena Petrova")]),
    ("Hello Mr. Okafor, your engineer is booked.", [("name", "Okafor")]),
    ("the account is in the name of Fiona MacLeod", [("name", "Fiona MacLeod")]),
    ("I live at 10 Downing Street, London SW1A 2AA", [("address", "10 Downing Street, London SW1A 2AA")]),
    ("new address: 4059 Mt Lee Dr, Hollywood, CA 90068", [("address", "4059 Mt Lee Dr, Hollywood, CA 90068")]),
    ("Bitte liefern an Friedrichstraße 123, 10117 Berlin.", [("address", "Friedrichstraße 123, 10117 Berlin")]),
    ("envoyez-le au 8 avenue des Champs-Élysées, 75008 Paris", [("address", "8 avenue des Champs-Élysées, 75008 Paris")]),
    ("ship to 77 Massachusetts Ave, Cambridge, MA 02139 please", [("address", "77 Massachusetts Ave, Cambridge, MA 02139")]),
    ("date of birth: 04/07/1976", [("date_of_birth", "04/07/1976")]),
    ("I was born on the 3rd of May 1990", [("date_of_birth", "3rd of May 1990")]),
    ("my birthday is 1988-12-24 if that helps verify", [("date_of_birth", "1988-12-24")]),
    ("DOB 22 Feb 1965", [("date_of_birth", "22 Feb 1965")]),
]
HANDWRITTEN_LOOKALIKES: list[str] = [
    "Order #NW-2024-0042-117 was cancelled", "my order 1234-5678-9012 never arrived", "order ORD 7781 2290 4410",
    "we served 2 500 000 customers last year", "It costs 1 299 kr per month", "a total of 14 000 000 page views",
    "firmware 1.4.22.7 fixed the wifi", "my router is on 3.10.2.118 now", "version 6.1.0.12 broke the app",
    "UPS 1Z12345E0205271688", "USPS 9405 5036 9930 0123 4567 89", "tracking: 4000 1234 5678 9010 (DHL eCommerce)",
    "Your parcel 7700 1234 5678 9000 is out for delivery", "ticket 2024-11-05-0007", "invoice 2023/0456/11",
    "the meeting is 10:30-11:15 tomorrow", "it happened 3 times between 9:00 and 17:00", "call us between 9 and 5",
    "I paid $1,234.56 on 2024-03-15", "Serial: 0987-6543-21", "reference 000-00-0000",
    "my password is wrong apparently", "Hi there! Thanks for waiting.", "I'm Not sure what happened",
    "Regards, Northwind Support Team", "the address field is blank on the form", "I was born in the nineties, not that it matters",
    "Great news: plan 500/50 is available", "Speed test: 943.2 Mbps down, 41.7 up", "model RT-AX88U, hw rev 1.0",
    "error 0x80070005 on update", "port 8080 is open", "ISBN 978-0-306-40615-7",
]

# Written after the detectors were done and measured once as they were, so these figures are not tuned.
HELD_OUT: list[tuple[str, list[tuple[str, str]]]] = [
    ("hiya, its me again - ring me on 0208 123 4567 pls", [("phone", "0208 123 4567")]),
    ("my cell: 312-555-0187. Thanks", [("phone", "312-555-0187")]),
    ("Numéro: +33 1 42 68 53 00", [("phone", "+33 1 42 68 53 00")]),
    ("you can also try my work line +49 (0)89 636 48018", [("phone", "+49 (0)89 636 48018")]),
    ("call my mom at 713.555.0199 if I don't pick up", [("phone", "713.555.0199")]),
    ("联系电话：186 1234 5678", [("phone", "186 1234 5678")]),
    ("mob. 07123 456789", [("phone", "07123 456789")]),
    ("Bangalore office: 080 4567 8901", [("phone", "080 4567 8901")]),
    ("Ph (07) 3123 4567 Brisbane", [("phone", "(07) 3123 4567")]),
    ("電話番号は 045-123-4567 です", [("phone", "045-123-4567")]),
    ("email is bob_smith99@hotmail.co.uk ok?", [("email", "bob_smith99@hotmail.co.uk")]),
    ("CC'ing maría.lópez@empresa.mx on this", [("email", "maría.lópez@empresa.mx")]),
    ("reach me: first.last+alerts@sub.company.travel", [("email", "first.last+alerts@sub.company.travel")]),
    ("Visa no. 4916 3385 0608 2832, expiry 04/28", [("credit_card", "4916 3385 0608 2832")]),
    ("mastercard 5425-2334-3010-9903", [("credit_card", "5425-2334-3010-9903")]),
    ("my amex is 371449635398431", [("credit_card", "371449635398431")]),
    ("i put in 3530 1113 3330 0000 (JCB)", [("credit_card", "3530 1113 3330 0000")]),
    ("social security 536-22-8765", [("national_id", "536-22-8765")]),
    ("ssn# 536228765", [("national_id", "536228765")]),
    ("My NINO is QQ 12 34 56 A", [("national_id", "QQ 12 34 56 A")]),
    ("account for refund: NL91 ABNA 0417 1643 00", [("iban", "NL91 ABNA 0417 1643 00")]),
    ("IBAN CH9300762011623852957", [("iban", "CH9300762011623852957")]),
    ("router WAN address 81.2.69.160 keeps changing", [("ip_address", "81.2.69.160")]),
    ("ipv6 fe80::1ff:fe23:4567:890a on eth0", [("ip_address", "fe80::1ff:fe23:4567:890a")]),
    ("slack token xoxp-2234567890-2234567890-123456789012-abcdef0123456789abcdef0123456789",
     [("api_key", "xoxp-2234567890-2234567890-123456789012-abcdef0123456789abcdef0123456789")]),
    ("stripe key sk_live_51HxYz2eZvKYlo2CabcDEF123", [("api_key", "sk_live_51HxYz2eZvKYlo2CabcDEF123")]),
    ("my password's Password1! lol", [("password", "Password1!")]),
    ("wifi key is Th3Gr8Wall", [("password", "Th3Gr8Wall")]),
    ("temporary password: kX7#mP2q", [("password", "kX7#mP2q")]),
    ("I'm Daniel Okonkwo, account holder", [("name", "Daniel Okonkwo")]),
    ("Best regards,\nAnnika Svensson", [("name", "Annika Svensson")]),
    ("my name's Luca Bianchi", [("name", "Luca Bianchi")]),
    ("Dear Ms. Kowalski, your refund is on its way.", [("name", "Kowalski")]),
    ("please send it to 1420 Maple Avenue, Denver, CO 80203", [("address", "1420 Maple Avenue, Denver, CO 80203")]),
    ("I live at Flat 2, 15 Elm Grove, Leeds LS6 2AB", [("address", "15 Elm Grove, Leeds LS6 2AB")]),
    ("Lieferadresse: Gartenweg 12, 80331 München", [("address", "Gartenweg 12, 80331 München")]),
    ("born 14/02/1979", [("date_of_birth", "14/02/1979")]),
    ("my DOB is July 4th, 1982", [("date_of_birth", "July 4th, 1982")]),
    ("date of birth - 1990.05.17", [("date_of_birth", "1990.05.17")]),
]
HELD_OUT_LOOKALIKES: list[str] = [
    "Order 2024-118-5521 is delayed", "order number: 118 552 1190", "PO 4500012345 approved",
    "the bill was 1 899,00 kr", "3 400 000 views on the video", "speed dropped to 12.5.0.4 after update? no, firmware 12.5.0.4",
    "build 4.18.0.305 is installed", "DPD parcel 01234567890123", "tracking ref 420 90210 9400 1111 2222 3333 44",
    "the SKU is 5-012345-678900", "case #00123456", "ticket INC0012345 opened", "reference number 7788-9900-1122",
    "call between 08:30 and 17:30", "the 2023/24 tax year", "total 12,345.67 USD", "version 2.0.0.1-beta crashed",
    "model number SM-G991B", "firmware v3.4.2.11", "Hi team, any update?", "This is taking forever",
    "I'm Unable to log in", "Thanks, will do", "my password doesn't work anymore", "the address on file is wrong",
]
