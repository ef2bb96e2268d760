"""Finders for context-cued PII: passwords, personal names and dates of birth (street addresses are in
mlops.data.pii_address).

No named-entity model can be installed here, so these types are found where people announce them: "my
password is ...", "my name is ...", "date of birth: ...", greetings and sign-offs. Each finder maps a text to
the (start, end) spans it claims; the cue itself stays readable ("my password is [PASSWORD]").
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from mlops.data.pii_structured import folded

Span = tuple[int, int]
TRAILING = ".,;:!?)]}\"'`”’»"
PLACEHOLDER = re.compile(r"\[[A-Z_]+\]")

# --------------------------------------------------------------------------- passwords

PASSWORD_RE = re.compile(
    r"\b(?:password|passwort|passwd|passphrase|passcode|pass\s?code|pass\s?word|pwd|pw|kennwort|mot de passe|"
    r"contraseña|contrasena|senha|wifi key|wi-fi key|wpa key|network key|pin(?:\s?code|\s?number)?)"
    r"(?:\s+(?:for|on|of)\s+(?:the\s+|my\s+|our\s+|your\s+)?[\w.-]+(?:\s+[\w.-]+)?)?"
    r"(?P<link>['’]s|\s+(?:is|was|will\s+be|should\s+be|would\s+be|is\s+now|is\s+still|=|:|-|set\s+to|changed\s+to|"
    r"reset\s+to|to|as|ist|est|es|é)|\s*[:=])\s*"
    r"(?:(?P<q>[\"'“‘«`])(?P<quoted>[^\"'”’»`\n]{1,80})[\"'”’»`]|(?P<bare>\S{2,80}))",
    re.IGNORECASE,
)
# "login bob, password hunter2": no linking word, so only a value that does not read as a word.
BARE_PASSWORD_RE = re.compile(r"\b(?:password|passwd|pwd|pw|passcode|pass)\s+(?P<bare>\S{4,80})", re.IGNORECASE)
CONTRACTION = re.compile(r"[A-Za-z]+['’][A-Za-z]{1,2}")  # "doesn't", "won't", "it's": a sentence goes on
# Words that follow "my password is" in sentences that give no password away.
NOT_A_PASSWORD = set("""
not wrong incorrect correct right invalid expired locked blocked working broken reset changed required needed the a an
my your our their too very still same different weak strong long short case fine ok okay saved stored forgotten
lost missing empty blank accepted rejected being no yes new old and or but that this it in on at of for to with
please also just already never always definitely probably somehow apparently now currently again here there what
which who how why when where whatever something nothing unknown different sent emailed written shown case-sensitive
manager field protected change recovery hint policy requirements rules strength prompt box screen page link
""".split())


PASSWORD_WORDS = ("pass", "pwd", "pw", "pin", "kennwort", "contrase", "senha", "key")


def find_password(text: str) -> Iterator[Span]:
    low = folded(text)
    if not any(w in low for w in PASSWORD_WORDS):
        return
    for m in (*PASSWORD_RE.finditer(text), *BARE_PASSWORD_RE.finditer(text)):
        if PLACEHOLDER.match(text, m.start(m.lastgroup)):
            continue  # already scrubbed: "my password is [PASSWORD]"
        if "quoted" in m.groupdict() and m.group("quoted") is not None:
            yield m.span("quoted")
            continue
        value = m.group("bare").rstrip(TRAILING)
        start = m.start("bare")
        if len(value) < 2 or value.lower() in NOT_A_PASSWORD:
            continue
        if "link" not in m.groupdict() and (value.isalpha() or len(value) < 4 or CONTRACTION.fullmatch(value)):
            continue
        is_pin = m.group(0).lower().lstrip().startswith("pin")
        if is_pin and not re.fullmatch(r"\d{3,8}", value):
            continue
        yield start, start + len(value)


# --------------------------------------------------------------------------- names

NAME_WORD = re.compile(r"[^\W\d_][\w'’\-]*")
GAP = re.compile(r"\.?[ \t]+")
PARTICLE = re.compile(r"van|von|de|der|den|del|della|da|di|du|la|le|bin|ibn|al|el|dos|das|ter|zu")
STRONG_NAME_CUE = re.compile(
    r"(?:\bmy\s+(?:full\s+|first\s+|last\s+|legal\s+|real\s+|sur)?name\s*(?:is|'s|’s|:)|"
    r"\b(?:full\s+|first\s+|last\s+|customer\s+|account\s+holder'?s?\s+|cardholder'?s?\s+|legal\s+|sur)?name\s*[:=]|"
    r"\b(?:i\s+am|i'm|i’m)\s+called|\bcall\s+me|\bname\s+on\s+the\s+(?:account|card|booking|order|lease)\s+is|"
    r"\b(?:account|card)\s*holder\s*(?:is|:)|\b(?:in|under)\s+the\s+name\s+(?:of\s+)?|"
    r"\bje\s+m['’]appelle|\bmon\s+nom\s+est|\bich\s+hei(?:ß|ss)e|\bmein\s+name\s+ist|\bme\s+llamo|"
    r"\bmi\s+nombre\s+es|\bmi\s+chiamo|\bmeu\s+nome\s+é|\bменя\s+зовут|\bmijn\s+naam\s+is)[ \t]*",
    re.IGNORECASE,
)
# "Hi Sarah," names someone; "Hi, Skip the check" does not: no comma between a greeting and a name.
GREETING_CUE = re.compile(r"(?:(?:^|(?<=[\n.!?,]))[ \t]*(?:hi|hello|hey|good\s+(?:morning|afternoon|evening))|\bdear)"
                          r"[ \t]+", re.IGNORECASE)
INTRO_CUE = re.compile(r"\b(?:this\s+is|it's|it’s|i\s+am|i'm|i’m|here\s+is|speaking\s+with)[ \t]+", re.IGNORECASE)
HONORIFIC_CUE = re.compile(r"\b(?:Mr|MR|Mrs|MRS|Ms|MS|Miss|Mx|Dr|DR|Prof|Herr|Frau|Mme|Madame|Monsieur|Sr|Sra|Señor|Señora)"
                           r"\.?[ \t]+")
SIGNOFF_CUE = re.compile(r"\b(?:regards|best\s+regards|kind\s+regards|warm\s+regards|sincerely|cheers|thanks|"
                         r"thank\s+you|many\s+thanks|best|yours|signed|merci|danke|gracias)[ \t]*,?[ \t]*\n?[ \t]*-?[ \t]*",
                         re.IGNORECASE)
CJK_NAME_RE = re.compile(r"(?:我叫|我的名字是|我的名字叫|私の名前は|제\s?이름은)\s*([\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af]{2,4})")
# Words after a cue that are not names ("Hi there", "I'm Sorry", "my name is not on the account").
NOT_A_NAME = set("""
there again all everyone everybody team support folks guys friends sir madam sorry not happy glad here still having
trying just also going calling writing contacting reaching looking wondering hoping back new sure afraid unable
unsure so very really a an the i thanks thank please yes no ok okay hello hi hey dear good great fine well
customer service agent admin user monday tuesday wednesday thursday friday saturday sunday january february march
april may june july august september october november december morning afternoon evening night today tomorrow
in on at from with about regarding re fwd fw following confused frustrated disappointed upset worried
interested waiting stuck done ready able available away home out sick tired busy online offline and or but
is was are were be been has have had will would can could should spelled misspelled listed shown wrong missing
incorrect different changed correct right same still your my our their his her its this that these those for to of
by as if when what which who how why where you we they he she it me us them one someone somebody nobody anyone
give skip tell show send help can could would write rewrite explain summarise summarize list reply answer describe
ignore pretend act make let find check cancel update reset change open close account plan billing order
""".split())


def _name_span(text: str, start: int, strong: bool) -> Span | None:
    """The name that starts at `start`: up to four words, particles inside ("Ludwig van Beethoven"); lower-case
    words only right after a strong cue ("my name is john smith")."""
    pos, end, words = start, None, 0
    while words < 4:
        m = NAME_WORD.match(text, pos)
        if m is None:
            break
        word = m.group(0)
        low = word.lower()
        if words and PARTICLE.fullmatch(low):
            gap = GAP.match(text, m.end())
            if gap and NAME_WORD.match(text, gap.end()) and text[gap.end()].isupper():
                pos = gap.end()
                continue
            break
        if low in NOT_A_NAME or (not word[0].isupper() and not strong) or len(word) < 2:
            break
        end, words = m.end(), words + 1
        gap = GAP.match(text, end)
        if gap is None:
            break
        pos = gap.end()
    if end is None:
        return None
    while end > start and text[end - 1] in TRAILING:
        end -= 1
    return start, end


STRONG_WORDS = ("name", "call", "appelle", "nom ", "hei", "llamo", "nombre", "chiamo", "nome", "зовут", "naam", "holder")
CUES = (("strong", STRONG_NAME_CUE), ("greeting", GREETING_CUE), ("intro", INTRO_CUE), ("honorific", HONORIFIC_CUE),
        ("signoff", SIGNOFF_CUE))
# The case-insensitive cues as gates on pii_structured.folded(text): their words are all written in lower case.
CUE_GATES = {kind: re.compile(cue.pattern) for kind, cue in CUES if cue.flags & re.IGNORECASE}


def find_name(text: str) -> Iterator[Span]:
    low = folded(text)
    strong_words = any(w in low for w in STRONG_WORDS)
    for kind, cue in CUES:
        if (kind == "strong" and not strong_words) or (kind in CUE_GATES and not CUE_GATES[kind].search(low)):
            continue
        for m in cue.finditer(text):
            yield from _cued_name(text, m, kind)
    if not text.isascii():
        yield from (m.span(1) for m in CJK_NAME_RE.finditer(text))


def _cued_name(text: str, m: re.Match[str], kind: str) -> Iterator[Span]:
    span = _name_span(text, m.end(), strong=kind in ("strong", "signoff"))
    # A sign-off name ends its line or the message: "Thanks, Maria" but not "Thanks, Support will call".
    if span and (kind != "signoff" or re.match(r"[ \t.!]*(?:\n|$)", text[span[1]:])):
        yield span


# --------------------------------------------------------------------------- dates of birth

MONTHS = (r"jan(?:uary|vier|uar|\.)?|feb(?:ruary|ruar|\.)?|févr(?:ier)?|fevrier|mar(?:ch|s|\.)?|mär(?:z)?|apr(?:il|\.)?|"
          r"avr(?:il)?|may|mai|mayo|jun(?:e|i|\.)?|juin|jul(?:y|i|\.)?|juil(?:let)?|aug(?:ust|\.)?|ao[uû]t|"
          r"sep(?:t(?:ember)?|\.)?|sept(?:embre)?|oct(?:ober|obre|\.)?|okt(?:ober)?|nov(?:ember|embre|\.)?|"
          r"dec(?:ember|\.)?|déc(?:embre)?|dez(?:ember)?|enero|febrero|marzo|abril|junio|julio|agosto|septiembre|"
          r"octubre|noviembre|diciembre")
DATE = (rf"(?:\d{{4}}[-/.]\d{{1,2}}[-/.]\d{{1,2}}|\d{{1,2}}[-/.]\d{{1,2}}[-/.](?:\d{{4}}|\d{{2}})|"
        rf"\d{{1,2}}(?:st|nd|rd|th|er)?\.?\s+(?:of\s+|de\s+)?(?:{MONTHS})\.?,?\s+(?:de\s+)?\d{{4}}|"
        rf"(?:{MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}|\d{{4}}年\d{{1,2}}月\d{{1,2}}日)")
DOB_RE = re.compile(
    r"(?:\bdate\s+of\s+birth|\bbirth\s?date|\bbirthday|\bborn|\bd\.?\s?o\.?\s?b\b\.?|\bgeburtsdatum|\bgeboren|"
    r"\bgeb\.|\bdate\s+de\s+naissance|\bné(?:e)?|\bfecha\s+de\s+nacimiento|\bnacid[oa]|\bdata\s+di\s+nascita|"
    r"\bnato|\bnata|出生日期|生年月日)"
    r"(?:[\s:=,-]*\b(?:is|was|on|in|am|le|el|il|the|of|my)\b){0,4}[\s:=,-]*"
    rf"(?P<date>{DATE})",
    re.IGNORECASE,
)


DOB_WORDS = ("birth", "born", "dob", "d.o.b", "d. o. b", "geb", "naissance", "né", "nacid", "nacimiento", "nascita",
             "nat", "出生", "生年")


def find_date_of_birth(text: str) -> Iterator[Span]:
    low = folded(text)
    if not any(w in low for w in DOB_WORDS):
        return
    yield from (m.span("date") for m in DOB_RE.finditer(text))
