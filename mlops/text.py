"""Text that people typed (comments, reasons, names), made safe to print on a terminal.

A comment holding escape codes, carriage returns or newlines could clear the screen or print a line that looks
like a ledger entry. `shown` keeps printable text as it is and writes every control character as its escape
(`\\x1b`, `\\n`), so what was typed is visible and can never act on the terminal.
"""

from __future__ import annotations

import unicodedata

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(value) -> str:
    text = "" if value is None else str(value)
    return "".join(_escaped(ch) if _control(ch) else ch for ch in text)


def shown_lines(text: str) -> str:
    """A block of lines made safe line by line: its own line breaks stay, every other control character is
    escaped (a last pass over output whose typed fields were already escaped where they were formatted)."""
    return "\n".join(shown(line) for line in str(text).split("\n"))


def _escaped(ch: str) -> str:
    code = ord(ch)
    return _NAMED.get(ch) or (f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}")


def _control(ch: str) -> bool:
    # Cc: C0/C1 controls (ESC, CR, LF, BEL, CSI); Cf: bidi overrides and zero-width marks that reorder a line.
    return unicodedata.category(ch) in ("Cc", "Cf")
