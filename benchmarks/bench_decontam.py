"""Decontamination against paraphrase: recall on paraphrased leaks, false positives on topical clean text, and
the cost of the rule, for the old rules and the shared `ContaminationRule`, side by side in one run.

Cases are `tests/data/decontam_cases.json` (hand-written paraphrases of eval items, each with its kind of
rewording, and clean texts that share a topic or a template with some item). The false-positive line also
runs every clean row of the generated sample corpus (round 1 and 2) against the real suites. Printed:
  recall        paraphrased leaks caught / all
  fp cases      clean case texts flagged / all
  fp corpus     clean sample-corpus messages flagged / all
  cost ratio    seconds to check the corpus, rule / old 13-gram rule (measured in this run)

Usage: .venv/bin/python benchmarks/bench_decontam.py
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mlops.data.config import ContaminationRule  # noqa: E402
from mlops.data.decontam import EvalIndex, strings_of  # noqa: E402

_RAW = re.compile(r"[a-z0-9]+")


class RawNgram:
    """The rules before the shared one: raw lowercase words, one n (13 in the build, 8 in the report)."""

    def __init__(self, n: int, min_words: int) -> None:
        self.n, self.min_words, self.grams, self.short, self.refs = n, min_words, {}, {}, []

    def _h(self, words):
        return hashlib.blake2b(" ".join(words).encode(), digest_size=8).digest()

    def add_item(self, item, ref):
        self.refs.append(ref)
        ref = len(self.refs) - 1
        for text in strings_of(item):
            words = _RAW.findall(text.lower())
            if len(words) >= self.n:
                for i in range(len(words) - self.n + 1):
                    self.grams.setdefault(self._h(words[i : i + self.n]), ref)
            elif len(words) >= self.min_words:
                self.short.setdefault(len(words), {}).setdefault(self._h(words), ref)

    def matches(self, text):
        words = _RAW.findall(text.lower())
        found = {self.grams.get(self._h(words[i : i + self.n])) for i in range(len(words) - self.n + 1)}
        for length, table in self.short.items():
            found |= {table.get(self._h(words[i : i + length])) for i in range(len(words) - length + 1)}
        return [(self.refs[ref], "") for ref in found if ref is not None]


def corpus_messages() -> list[str]:
    """Every message of the clean rows of the sample corpus, rounds 1 and 2."""
    from mlops.data.sample import sample_rows

    out = []
    for round_ in (1, 2):
        for rows in sample_rows(round_=round_).clean.values():
            for row in rows:
                out += [m["content"] for m in row["messages"]] if "messages" in row else \
                    [row.get(k, "") for k in ("text", "instruction", "input", "output") if row.get(k)]
    return out


def suite_index(make):
    from evaluation.contamination import suite_items
    from evaluation.suites import get_suites

    index = make()
    for suite, task, item in suite_items(get_suites("general,business")):
        index.add_item(item, {"id": f"{suite}/{task}/{item.get('id')}"})
    return index


def main() -> None:
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    measure()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def measure() -> dict:
    """Recall on paraphrased leaks, false positives on look-alikes and on the sample corpus, and cost, per rule;
    printed as a table (`bench_data.py` prints it beside the PII and dedup figures)."""
    cases = json.loads((REPO / "tests" / "data" / "decontam_cases.json").read_text())
    messages = corpus_messages()
    results = {}
    rules = {"build 13-gram (old)": lambda: RawNgram(13, 8), "report 8-gram (old)": lambda: RawNgram(8, 1),
             "shared rule (default)": lambda: EvalIndex(ContaminationRule())}
    seconds = {}
    print(f"{'rule':24} {'recall':>9} {'fp cases':>9} {'fp corpus':>11} {'seconds':>8}")
    for name, make in rules.items():
        index = make()
        for item in cases["eval_items"]:
            index.add_item(item, {"id": item["id"]})
        caught = sum(leak["eval_id"] in {r["id"] for r, _ in index.matches(leak["text"])} for leak in cases["leaks"])
        fp = sum(bool(index.matches(c["text"])) for c in cases["clean"])
        real = suite_index(make)
        started = time.perf_counter()
        flagged = sum(bool(real.matches(m)) for m in messages)
        seconds[name] = time.perf_counter() - started
        print(f"{name:24} {caught:>4}/{len(cases['leaks']):<4} {fp:>4}/{len(cases['clean']):<4} "
              f"{flagged:>5}/{len(messages):<5} {seconds[name]:>8.2f}")
        results[name] = {"leaks_caught": caught, "leaks": len(cases["leaks"]), "fp_cases": fp,
                         "clean_cases": len(cases["clean"]), "fp_corpus": flagged, "corpus": len(messages),
                         "seconds": seconds[name]}
    ratio = seconds["shared rule (default)"] / seconds["build 13-gram (old)"]
    print(f"cost ratio shared/old-13: {ratio:.2f} ({len(messages)} messages)")
    return {"rules": results, "cost_ratio": ratio}


if __name__ == "__main__":
    main()
