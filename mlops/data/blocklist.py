"""The sensitive-term blocklist (`data.filters.blocklist`): a list file of terms and regexes; a record that holds
one is rejected with reason `blocklist` (counted as `filter.blocklist`, quarantined like every filter).

The file holds one entry per line; blank lines and lines starting with `#` are skipped:

    secret project name            a term (its spaces match any run of whitespace)
    re:\\bpass(?:word|wd)\\s*[:=]    a Python regular expression, used as written

Terms match whole words only: "ass" never matches "class" or "passé", because a term edge that is a word
character needs a non-word character (or the text's end) beside it, with Unicode's idea of a word character.
Text and terms are NFKC-normalised (fullwidth "ＡＢＣ" is "ABC") and compared case-insensitively unless
`case_sensitive` is set. Terms in scripts written without spaces between words (Chinese, Japanese, Thai, Lao,
Khmer, Burmese) and Korean, whose particles attach to the noun ("바보야"), match as substrings: a word boundary
there would almost never occur inside running text, so the term would never match. The price is substring false
positives in those scripts (a two-character term inside a longer word); list longer terms there, or a regex.

The list is read and compiled once, by the build before any record is processed (`load`); a file that cannot be
read, holds no entry, or holds a bad regex is a ConfigError naming `data.filters.blocklist`, the value and the fix.
Workers get the compiled list, not the path (`install`), so Ray nodes need no copy of the file.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from mlops.errors import ConfigError

FIELD = "data.filters.blocklist"
REGEX_PREFIX = "re:"
# Scripts without spaces between words (or with particles glued to words): substring matching there.
NO_SPACE_SCRIPTS = ("CJK", "HIRAGANA", "KATAKANA", "HANGUL", "THAI", "LAO", "KHMER", "MYANMAR", "IDEOGRAPHIC")


@dataclass(frozen=True)
class Blocklist:
    path: str
    sha256: str
    entries: int
    pattern: re.Pattern
    case_sensitive: bool = False

    def find(self, text: str) -> str | None:
        """The first blocked span of `text`, or None."""
        m = self.pattern.search(unicodedata.normalize("NFKC", text))
        return None if m is None else m.group(0)


_ACTIVE: dict[tuple[str, bool], Blocklist] = {}


def no_space_char(ch: str) -> bool:
    return unicodedata.name(ch, "").split(" ", 1)[0] in NO_SPACE_SCRIPTS


def term_pattern(term: str) -> str:
    """A literal term as a regex: whitespace runs match any whitespace, and an edge that is a word character
    (outside the no-space scripts) must not touch another word character."""
    body = r"\s+".join(re.escape(part) for part in term.split())
    first, last = term.strip()[0], term.strip()[-1]
    before = r"(?<!\w)" if (first.isalnum() or first == "_") and not no_space_char(first) else ""
    after = r"(?!\w)" if (last.isalnum() or last == "_") and not no_space_char(last) else ""
    return f"{before}{body}{after}"


def _bad(value: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{FIELD} '{value}' {problem}. Fix: {fix}.")


def compile_lines(lines: list[str], value: str, case_sensitive: bool = False) -> tuple[re.Pattern, int]:
    flags = 0 if case_sensitive else re.IGNORECASE
    parts = []
    for number, raw in enumerate(lines, 1):
        line = unicodedata.normalize("NFKC", raw.strip())
        if not line or line.startswith("#"):
            continue
        if line.startswith(REGEX_PREFIX):
            expr = line[len(REGEX_PREFIX):].strip()
            try:
                compiled = re.compile(expr, flags)
            except re.error as err:
                raise _bad(value, f"line {number} holds a bad regex {expr!r} ({err})",
                           "correct the regex (Python syntax), or drop the 're:' prefix to match the line as a "
                           "literal term") from None
            if compiled.search(""):
                raise _bad(value, f"line {number}: regex {expr!r} matches the empty string, so it would block "
                           "every record", "make the regex require at least one character") from None
            parts.append(f"(?:{expr})")
        else:
            parts.append(term_pattern(line))
    if not parts:
        raise _bad(value, "holds no term or regex (only blank or # lines)",
                   "add one entry per line, or unset data.filters.blocklist")
    # Longer alternatives first, so a phrase wins over a term it starts with (which is only a report detail).
    parts.sort(key=len, reverse=True)
    return re.compile("|".join(parts), flags), len(parts)


def load(value: str, path: Path, case_sensitive: bool = False) -> Blocklist:
    """Read and compile the list file; ConfigError names the field, the value and the fix."""
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8-sig")
    except FileNotFoundError:
        raise _bad(value, f"does not exist (looked at {path})",
                   "correct the path (relative paths are under the project home) or unset it") from None
    except UnicodeDecodeError as err:
        raise _bad(value, f"is not UTF-8 text ({err.reason} at byte {err.start})", "save the file as UTF-8") from None
    except OSError as err:
        raise _bad(value, f"cannot be read ({err.strerror or err})",
                   "make it a readable file (check its permissions), or unset it") from None
    pattern, entries = compile_lines(text.splitlines(), value, case_sensitive)
    return Blocklist(value, hashlib.sha256(raw).hexdigest(), entries, pattern, case_sensitive)


def install(blocklist: Blocklist | None) -> None:
    """Make a compiled list the one the `blocklist` filter uses for its path (in a worker process)."""
    if blocklist is not None:
        _ACTIVE[(blocklist.path, blocklist.case_sensitive)] = blocklist


def active(value: str, case_sensitive: bool = False) -> Blocklist:
    """The installed list for `value`, else read from the path (unit tests; the build always installs it)."""
    found = _ACTIVE.get((value, case_sensitive))
    if found is None:
        from mlops.paths import project_home

        path = Path(value).expanduser()
        found = load(value, path if path.is_absolute() else project_home() / path, case_sensitive)
        _ACTIVE[(value, case_sensitive)] = found
    return found
