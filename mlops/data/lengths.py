"""Length distributions for the acceptance report: exact histograms (length -> records) that merge by addition.

Each record is measured where it is cleaned (in the worker that scrubs it, `measure`): characters and content
tokens (the base tokenizer on the messages' text, no chat template) before cleaning, and again after scrubbing
for a record that passes the filters. The build adds a record's "before" figures when it reads its result and its
"after" figures when it keeps it. A histogram is a sum over records, so the report is the same whichever executor
or chunking produced the results, and memory grows with the number of distinct lengths, not of records.

Percentiles use the nearest-rank rule on the exact histogram: p is the smallest length at least p% of the records
do not exceed. No interpolation, so every executor gets the same integers.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

PERCENTILES = (5, 50, 95, 99)
# A record longer than this is tokenized on its first TOKENIZE_CAP characters and its count scaled to its length:
# a 50 MB record costs no more than a long one, and it is far beyond any percentile that matters.
TOKENIZE_CAP = 100_000


def percentile(hist: Counter, p: float) -> int:
    total = sum(hist.values())
    if not total:
        return 0
    rank = max(1, math.ceil(p / 100 * total))
    seen = 0
    for length in sorted(hist):
        seen += hist[length]
        if seen >= rank:
            return int(length)
    return int(max(hist))


def summary(hist: Counter) -> dict:
    n = sum(hist.values())
    out = {f"p{p}": percentile(hist, p) for p in PERCENTILES}
    out["max"] = int(max(hist)) if hist else 0
    out["mean"] = round(sum(k * v for k, v in hist.items()) / n, 1) if n else 0.0
    return out


def share_over(hist: Counter, limit: int) -> float:
    n = sum(hist.values())
    return round(sum(v for k, v in hist.items() if k > limit) / n, 4) if n else 0.0


def count_tokens(texts: list[str]) -> list[int] | None:
    """Content tokens per text with this process's tokenizer (mlops.data.tokenize); None when none is loaded."""
    from mlops.data import tokenize

    if "tok" not in tokenize._STATE:
        return None
    cut = [t[:TOKENIZE_CAP] for t in texts]
    counts = tokenize.tokenizer().count(cut)
    return [n if len(t) <= TOKENIZE_CAP else math.ceil(n * len(t) / TOKENIZE_CAP) for n, t in zip(counts, texts,
                                                                                                   strict=True)]


def measure(texts: list[str]) -> list[tuple[int, int]]:
    """(characters, content tokens) per text; tokens are -1 without a tokenizer (a unit test's bare worker)."""
    tokens = count_tokens(texts)
    return [(len(t), -1 if tokens is None else tokens[i]) for i, t in enumerate(texts)]


class LengthStats:
    """Histograms by (axis, key, stage, unit): axis source|domain, stage before|after, unit chars|tokens."""

    def __init__(self) -> None:
        self.hists: dict[tuple[str, str, str, str], Counter] = defaultdict(Counter)

    def add(self, source: str, domain: str, stage: str, figures: tuple[int, int] | None) -> None:
        if figures is None:
            return
        for axis, key in (("source", source), ("domain", domain), ("all", "all")):
            for unit, value in zip(("chars", "tokens"), figures, strict=True):
                if value >= 0:
                    self.hists[(axis, key, stage, unit)][value] += 1

    def update(self, other: LengthStats) -> None:
        for key, hist in other.hists.items():
            self.hists[key].update(hist)

    def table(self, axis: str) -> dict:
        """{key: {stage: {"records", "chars": {p5..}, "tokens": {p5..}}}}."""
        out: dict = {}
        for (a, key, stage, unit), hist in sorted(self.hists.items()):
            if a != axis:
                continue
            row = out.setdefault(key, {}).setdefault(stage, {"records": sum(hist.values())})
            row[unit] = summary(hist)
        return out

