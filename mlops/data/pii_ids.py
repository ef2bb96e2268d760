"""Finders for identity numbers and credentials: national ids (US SSN and ITIN, UK NINO, checksummed ids of
China, Brazil, Spain, India and France, and any id number after a cue such as "passport number"), and API keys,
tokens and private keys (the provider shapes of `detect-secrets` plus a few it does not know, and a cue with a
high-entropy value). Each finder maps a text to the (start, end) spans it claims.
"""

from __future__ import annotations

import base64
import functools
import math
import re
from collections import Counter
from collections.abc import Iterator

from mlops.data.pii_structured import SIX_DIGITS, Span, before, folded, labelled_reference

# --------------------------------------------------------------------------- national ids

# A pattern that opens with a digit (a letter set) scans from one to the next; one that opens with a lookbehind
# tries every position. So "(?<![\w-])\d" is written "\d(?<![\w-]\d)": the same matches, several times faster.
SSN_RE = re.compile(r"(\d(?<![\w-]\d)\d{2})([- \u00a0])(\d{2})\2(\d{4})(?![\w]|-\d)")
BARE9_RE = re.compile(r"\d(?<![\w-]\d)\d{8}(?![\w]|-\d)")
SSN_CUE = re.compile(r"\b(?:ssn|ss#|ss no|social security|social sec|social-security|itin|tin|tax id|"
                     r"taxpayer id|sin|social insurance)\b", re.IGNORECASE)
# HMRC's own examples (QQ 12 34 56 A) break the prefix rules below; after a cue any two letters will do.
NINO_CUE_RE = re.compile(r"\b(?:nino|ni\s+(?:no\.?|number)|national\s+insurance(?:\s+(?:no\.?|number))?)\s*(?:is|:|#)?\s*"
                         r"(?P<value>[A-Z]{2} ?\d{2} ?\d{2} ?\d{2} ?[A-D])\b", re.IGNORECASE)
NINO_DIGITS = re.compile(r"\d\d ?\d\d ?\d\d ?[A-D]")  # a gate for UK_NINO_RE
UK_NINO_RE = re.compile(r"\b(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b")
ID_CUES = (r"passport|driver'?s?\s+licen[cs]e|driving\s+licen[cs]e|licen[cs]e\s+(?:number|no\.?)|national\s+id|"
           r"national\s+insurance|id\s+card|identity\s+card|identity\s+number|id\s+number|personal\s+id|ssn|"
           r"social\s+security|social\s+insurance|sin|aadhaa?r|pan|dni|nie|nif|bsn|cpf|steuer-?id|tax\s+id|tin|"
           r"personalausweis|insee|nir|codice\s+fiscale|personnummer|pesel|curp|身份证")
# Gates on pii_structured.folded(text): a cue needs its word, the cued NINO its cue.
ID_CUE_GATE = re.compile(rf"\b(?:{ID_CUES})")
NINO_CUE_GATE = re.compile(r"\b(?:nino|ni\s+n|national\s+insurance)")
ID_CUE_VALUE = re.compile(
    rf"\b(?:{ID_CUES})"
    r"(?:\s*(?:number|num|no\.?|nr\.?|#|code))?\s*(?:is|was|:|=|-)?\s*(?:is\s+|:\s*)?"
    r"(?P<value>[A-Z]{0,3}\d[\d \-]{3,20}\d[A-Z]?|[A-Z]{1,3}\d{5,12}[A-Z]?|\d{5,12}[A-Z]{1,2})(?![\w-])",
    re.IGNORECASE,
)
CHECKSUMMED = (
    (re.compile(r"\d(?<![\w-]\d)\d{16}[\dXx](?![\w-])"), "stdnum.cn.ric"),  # China resident id
    (re.compile(r"\d(?<![\w-]\d)\d{2}\.\d{3}\.\d{3}-\d{2}(?![\w-])"), "stdnum.br.cpf"),  # Brazil CPF
    (re.compile(r"\d(?<![\w-]\d)\d{7}-?[A-Z](?![\w-])"), "stdnum.es.dni"),  # Spain DNI
    (re.compile(r"[XYZ](?<![\w-][XYZ])-?\d{7}-?[A-Z](?![\w-])"), "stdnum.es.nie"),  # Spain NIE
    (re.compile(r"[A-Z](?<![\w-][A-Z])[A-Z]{2}[ABCFGHLJPT][A-Z]\d{4}[A-Z](?![\w-])"), "stdnum.in_.pan"),  # India PAN
    (re.compile(r"[12](?<![\w-][12])\s?\d{2}\s?\d{2}\s?(?:\d{2}|2[AB])\s?\d{3}\s?\d{3}\s?\d{2}(?![\w-])"),
     "stdnum.fr.nir"),  # France INSEE / NIR
)


REF_WORD = re.compile(r"\b(?:order|customer|account|member|ticket|case|booking|invoice|tracking|user|employee)\s*\Z",
                      re.IGNORECASE)


def _ssn_parts_ok(area: str, group: str, serial: str) -> bool:
    return area not in ("000", "666") and group != "00" and serial != "0000"


LONG_TOKEN = re.compile(r"[A-Za-z0-9_\-+/=.]{16,}|PRIVATE KEY|://")


def find_national_id(text: str) -> Iterator[Span]:
    if not SIX_DIGITS.search(text):  # every id this finds has six digits or more
        return
    for m in SSN_RE.finditer(text):
        if _ssn_parts_ok(m.group(1), m.group(3), m.group(4)) and not labelled_reference(text, m.start(), SSN_CUE):
            yield m.span()
    for m in BARE9_RE.finditer(text):
        d = m.group(0)
        if SSN_CUE.search(before(text, m.start(), 40)) and _ssn_parts_ok(d[:3], d[3:5], d[5:]):
            yield m.span()
    if NINO_DIGITS.search(text):
        yield from (m.span() for m in UK_NINO_RE.finditer(text))
    low = folded(text)
    if NINO_CUE_GATE.search(low):
        yield from (m.span("value") for m in NINO_CUE_RE.finditer(text))
    for m in ID_CUE_VALUE.finditer(text) if ID_CUE_GATE.search(low) else ():
        value = m.group("value").strip()
        # "customer id number 1234567" is a reference, not an identity document.
        if sum(c.isdigit() for c in value) >= 5 and not REF_WORD.search(before(text, m.start(), 24)):
            yield m.start("value"), m.start("value") + len(value)
    import importlib

    for pattern, module in CHECKSUMMED:
        for m in pattern.finditer(text):
            if importlib.import_module(module).is_valid(m.group(0)) and not labelled_reference(text, m.start()):
                yield m.span()


# --------------------------------------------------------------------------- API keys, tokens, private keys

# Shapes of provider keys that detect-secrets (1.5) does not cover.
EXTRA_KEY_PATTERNS = [
    r"\bsk-(?:proj-|ant-(?:api\d\d-)?|live-|svcacct-)?[A-Za-z0-9_\-]{20,}",  # OpenAI / Anthropic style
    r"\b[rsp]k_(?:live|test)_[0-9A-Za-z]{16,}",  # Stripe (test keys too)
    r"\bAIza[0-9A-Za-z_\-]{35}",  # Google API key
    r"\bya29\.[0-9A-Za-z_\-]{20,}",  # Google OAuth access token
    r"\bhf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"\bnpm_[A-Za-z0-9]{36}",  # npm
    r"\bgithub_pat_[A-Za-z0-9_]{40,}",  # GitHub fine-grained token
    r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b",  # AWS access key id
    r"\bxox[abposr]-[0-9A-Za-z\-]{10,}",  # Slack
    r"\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",  # SendGrid
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWT
    r"-----BEGIN [A-Z ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
]
DETECT_SECRETS_PLUGINS = ("aws.AWSKeyDetector", "azure_storage_key.AzureStorageKeyDetector",
                          "discord.DiscordBotTokenDetector", "github_token.GitHubTokenDetector",
                          "gitlab_token.GitLabTokenDetector", "jwt.JwtTokenDetector", "mailchimp.MailchimpDetector",
                          "openai.OpenAIDetector", "pypi_token.PypiTokenDetector", "sendgrid.SendGridDetector",
                          "slack.SlackDetector", "square_oauth.SquareOAuthDetector", "stripe.StripeDetector",
                          "telegram_token.TelegramBotTokenDetector", "twilio.TwilioKeyDetector")
# "aws_secret_access_key", "GITHUB_TOKEN": a setting's name holds the cue after an underscore, where \b is not.
SECRET_CUE_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:api[\s_-]?key|apikey|api[\s_-]?token|access[\s_-]?key(?:[\s_-]?id)?|secret[\s_-]?(?:access[\s_-]?)?key|"
    r"client[\s_-]?secret|auth[\s_-]?token|access[\s_-]?token|refresh[\s_-]?token|bearer[\s_-]?token|"
    r"token|secret|private[\s_-]?key|session[\s_-]?id|x-api-key|authorization)"
    r"(?:\s+(?:is|was))?\s*[:=]?\s*(?P<scheme>(?:bearer|basic|token)\s+)?[\"'`]?(?P<value>[A-Za-z0-9_\-./+=:~]{16,})",
    re.IGNORECASE,
)
# The scheme word is part of the credential ("Authorization: Bearer [API_KEY]" is a partial mask), and "token"
# goes with its value too: "I pasted [API_KEY]" reads as well as "I pasted token [API_KEY]".
BEARER_RE = re.compile(r"\b(?P<scheme>bearer|basic|token)\s+(?P<value>[A-Za-z0-9_\-./+=~]{12,})", re.IGNORECASE)
URL_CREDENTIALS = re.compile(r"://[^\s:/@]+:(?P<value>[^\s:/@]+)@")


@functools.lru_cache(maxsize=1)
def key_patterns() -> re.Pattern[str]:
    import importlib

    patterns = list(EXTRA_KEY_PATTERNS)
    for name in DETECT_SECRETS_PLUGINS:
        module, cls = name.rsplit(".", 1)
        plugin = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), cls)
        patterns += [p.pattern for p in plugin.denylist]
    # Capture groups inside the plugins' patterns would confuse one combined alternation: make them plain.
    plain = [re.sub(r"\((?!\?)", "(?:", p) for p in patterns]
    return re.compile("|".join(f"(?:{p})" for p in plain))


def entropy(value: str) -> float:
    counts = Counter(value)
    return -sum(c / len(value) * math.log2(c / len(value)) for c in counts.values())


def secret_like(value: str) -> bool:
    value = value.rstrip(".,;:)\"'`")
    has_digit = any(c.isdigit() for c in value)
    has_alpha = any(c.isalpha() for c in value)
    return len(value) >= 12 and has_digit and has_alpha and entropy(value) >= 3.0 and "://" not in value


def basic_credentials(value: str) -> bool:
    """HTTP Basic credentials are base64 of "user:password": often no digit and little entropy, but they decode."""
    try:
        raw = base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return False
    return ":" in raw and raw.isprintable()


def find_api_key(text: str) -> Iterator[Span]:
    if not LONG_TOKEN.search(text):  # keys and tokens are long runs; prose rarely is
        return
    for m in key_patterns().finditer(text):
        if m.end() - m.start() >= 12:
            yield m.span()
    for pattern in (SECRET_CUE_VALUE, BEARER_RE):
        pos = 0
        while (m := pattern.search(text, pos)) is not None:
            value = m.group("value").rstrip(".,;:)\"'`")
            scheme = (m.group("scheme") or "").strip().lower()
            if secret_like(value) or (scheme == "basic" and basic_credentials(value)):
                yield m.start("scheme") if scheme else m.start("value"), m.start("value") + len(value)
                pos = m.end()
            else:  # "token: my_api_key=..." : a refused value may hold the next cue
                pos = m.start() + 1
    if "://" in text:
        yield from (m.span("value") for m in URL_CREDENTIALS.finditer(text))
