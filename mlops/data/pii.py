"""PII scrubbing: typed placeholders ([EMAIL], [PHONE], [CREDIT_CARD], ...) for what the registered detectors
find.

Every detector maps the original text to spans (mlops.data.pii_structured, mlops.data.pii_email and
mlops.data.pii_ids for checksummed and library-parsed types, mlops.data.pii_context and mlops.data.pii_address
for cue-led ones). A mask never leaves a fragment of what it masks: each span first grows to the whole tokens
it touches ("2367 [ADDRESS]4 Madrid" kept a digit of the postcode); overlapping spans are settled by a fixed
precedence, most specific first (an API key before an email inside it, a card before a phone number), whatever
the order of `data.pii.types`, and what a losing span claims beyond the winners, if that is most of it, is
still masked under its own placeholder: a postcode read as a phone number must not unmask the street around it.
`redact()` is the one way a rejected record's text may leave the pipeline: every detector, then a length bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mlops.data import pii_address as addr
from mlops.data import pii_context as ctx
from mlops.data import pii_email as em
from mlops.data import pii_ids as ids
from mlops.data import pii_structured as st
from mlops.errors import ConfigError, did_you_mean
from mlops.plugins import Registry

Span = tuple[int, int]


@dataclass(frozen=True)
class Detector:
    name: str
    placeholder: str
    find: Callable[[str], Iterable[Span]]
    cued: bool = False  # found by the words around it, not by its own shape (recall goals differ)


DETECTORS: Registry[Detector] = Registry("PII detector")
# Precedence when spans overlap, most specific first.
for _det in (
    Detector("api_key", "[API_KEY]", ids.find_api_key),
    Detector("email", "[EMAIL]", em.find_email),
    Detector("iban", "[IBAN]", st.find_iban),
    Detector("credit_card", "[CREDIT_CARD]", st.find_card),
    Detector("national_id", "[NATIONAL_ID]", ids.find_national_id),
    Detector("ip_address", "[IP_ADDRESS]", st.find_ip),
    Detector("date_of_birth", "[DATE_OF_BIRTH]", ctx.find_date_of_birth, cued=True),
    Detector("password", "[PASSWORD]", ctx.find_password, cued=True),
    Detector("phone", "[PHONE]", st.find_phone),
    Detector("address", "[ADDRESS]", addr.find_address, cued=True),
    Detector("name", "[NAME]", ctx.find_name, cued=True),
):
    DETECTORS.add(_det.name, _det)
PRECEDENCE = {name: rank for rank, name in enumerate(DETECTORS._items)}
ALL_TYPES = list(PRECEDENCE)
luhn_ok = st.luhn_ok


def whole_tokens(text: str, start: int, end: int) -> Span:
    """The span grown to the tokens it touches: a mask that starts or ends inside a word or a digit run leaves
    the rest of it readable beside the placeholder."""
    while start > 0 and st.code_char(text[start - 1]) and st.code_char(text[start]):
        start -= 1
    while end < len(text) and st.code_char(text[end - 1]) and st.code_char(text[end]):
        end += 1
    return start, end


def uncovered(start: int, end: int, taken: list[Span]) -> list[Span]:
    """The parts of [start, end) outside every taken span."""
    pieces = [(start, end)]
    for ts, te in taken:
        pieces = [p for s, e in pieces for p in ((s, min(e, ts)), (max(s, te), e)) if p[1] > p[0]]
    return pieces


def check_types(types: list[str], field: str = "data.pii.types") -> None:
    """Fail with the field, the value and the choices before any work (a typo must not reach a worker)."""
    for i, name in enumerate(types):
        if name not in DETECTORS:
            raise ConfigError(f"{field}[{i}] is '{name}', which is no PII detector: "
                              f"{did_you_mean(name, DETECTORS.names())}. Fix: correct or remove it.")
    duplicates = sorted({n for n in types if types.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{field} lists {duplicates} more than once. Fix: name each detector once.")


class Scrubber:
    """Replaces PII in text; `counts` accumulates replacements per type."""

    def __init__(self, types: list[str]) -> None:
        check_types(types)
        self.detectors = sorted((DETECTORS.get(name) for name in types), key=lambda d: PRECEDENCE[d.name])
        self.counts: Counter[str] = Counter()

    def spans(self, text: str) -> list[tuple[int, int, Detector]]:
        """Non-overlapping (start, end, detector) on token boundaries, in text order; earlier detectors win, then
        longer spans, and a losing span keeps what no winner covers."""
        found = [(*whole_tokens(text, s, e), det) for det in self.detectors for s, e in det.find(text) if e > s]
        found.sort(key=lambda x: (PRECEDENCE[x[2].name], x[0] - x[1], x[0]))
        taken: list[tuple[int, int, Detector]] = []
        for s, e, det in found:
            pieces = uncovered(s, e, [(ts, te) for ts, te, _ in taken])
            if sum(pe - ps for ps, pe in pieces) * 2 < e - s:
                continue  # mostly another entity ("send the money to IBAN ..." read as an address): rank decides
            for ps, pe in pieces:
                # A comma or a space left between two masks is no PII; a value all of punctuation may be ("!!!!").
                if (ps, pe) == (s, e) or any(c.isalnum() for c in text[ps:pe]):
                    taken.append((ps, pe, det))
        return sorted(taken, key=lambda x: x[0])

    def scrub(self, text: str) -> str:
        if not text or not self.detectors:
            return text
        out, pos = [], 0
        for s, e, det in self.spans(text):
            out += [text[pos:s], det.placeholder]
            pos = e
            self.counts[det.name] += 1
        out.append(text[pos:])
        return "".join(out)

    def find(self, text: str) -> list[tuple[str, str]]:
        """(type, match) pairs present in `text`: what the scrubber would replace."""
        return [(det.name, text[s:e]) for s, e, det in self.spans(text)]


_REDACTOR: list[Scrubber] = []


def redact(text: str, limit: int = 200) -> str:
    """A bounded excerpt with every PII type replaced: the only form in which text of a rejected record is kept
    in quarantine files, manifests, logs or tracking."""
    if not _REDACTOR:
        _REDACTOR.append(Scrubber(ALL_TYPES))
    head = text[: limit * 2]  # scrub more than is kept, and cut at a space: no value is kept half-seen
    if len(text) > len(head):
        cut = max(head.rfind(" "), head.rfind("\n"))
        head = head[:cut] if cut > 0 else head[:limit]
    clean = _REDACTOR[0].scrub(head)
    if len(clean) > limit or len(text) > len(head):
        return clean[:limit] + f" …[{len(text):,} chars]"
    return clean
