"""Scorers for generation tasks, computed locally.

`evaluate.load("exact_match")` / `"squad"` fetch their metric scripts from the Hugging Face Hub, which is
unreachable here, so the same definitions are implemented in this module: SQuAD normalisation (lowercase,
drop punctuation and articles, collapse whitespace), exact match and token-level F1 as in the SQuAD v1.1
evaluation script, maximised over a target's accepted aliases. Multiple-choice tasks use lm-eval's own
`acc`/`acc_norm` on loglikelihoods.
"""

from __future__ import annotations

import collections
import json
import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")
_PUNCT = set(string.punctuation)


def normalize(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, target: str) -> float:
    return float(normalize(prediction) == normalize(target))


def token_f1(prediction: str, target: str) -> float:
    pred, gold = normalize(prediction).split(), normalize(target).split()
    if not pred or not gold:
        return float(pred == gold)
    common = collections.Counter(pred) & collections.Counter(gold)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(gold)
    return 2 * precision * recall / (precision + recall)


def answers(doc: dict) -> list[str]:
    return [str(doc["target"]), *(str(a) for a in doc.get("aliases") or [])]


def score_squad(doc: dict, output: str) -> dict[str, float]:
    """Exact match, token F1 and normalised containment, each maximised over the accepted answers."""
    golds = answers(doc)
    out = normalize(output)
    return {
        "exact_match": max(exact_match(output, g) for g in golds),
        "f1": max(token_f1(output, g) for g in golds),
        "contains": max(float(bool(normalize(g)) and f" {normalize(g)} " in f" {out} ") for g in golds),
    }


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text.replace(",", ""))
    return found[-1].rstrip(".") if found else None


def score_number(doc: dict, output: str) -> dict[str, float]:
    """The last number in the output equals the target (as numbers: '42.0' == '42')."""
    got = last_number(output)
    try:
        ok = got is not None and float(got) == float(doc["target"])
    except ValueError:
        ok = False
    return {"exact_match": float(ok)}


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9']+", text)


def check(spec: dict, output: str) -> bool:
    """One verifiable instruction (IFEval-style) on the model's output."""
    text = output.strip()
    kind = spec["type"]
    if kind == "exact":
        return normalize(text) == normalize(spec["value"])
    if kind == "exact_case":
        return text.rstrip(".!").strip() == spec["value"]
    if kind == "contains":
        return all(v.lower() in text.lower() for v in spec["values"])
    if kind == "excludes":
        return not any(re.search(rf"\b{re.escape(v.lower())}", text.lower()) for v in spec["values"])
    if kind == "starts_with":
        return text.lower().startswith(spec["value"].lower())
    if kind == "ends_with":
        return text.lower().endswith(spec["value"].lower())
    if kind == "max_words":
        return len(_words(text)) <= spec["n"]
    if kind == "min_words":
        return len(_words(text)) >= spec["n"]
    if kind == "upper":
        return any(c.isalpha() for c in text) and text == text.upper()
    if kind == "lower":
        return any(c.isalpha() for c in text) and text == text.lower()
    if kind == "no_char":
        return spec["value"].lower() not in text.lower()
    if kind == "lines":
        return len([line for line in text.splitlines() if line.strip()]) == spec["n"]
    if kind in ("json_keys", "json_list"):
        try:
            value = json.loads(text.strip("`").removeprefix("json").strip())
        except ValueError:
            return False
        if kind == "json_list":
            return isinstance(value, list) and len(value) == spec["n"]
        return isinstance(value, dict) and all(k in value for k in spec["keys"])
    raise ValueError(f"unknown instruction check type '{kind}'")


def score_checks(doc: dict, output: str) -> dict[str, float]:
    """`pass`: every check holds (strict, per prompt); `check_rate`: the share of checks that hold."""
    results = [check(spec, output) for spec in doc["checks"]]
    return {"pass": float(all(results)), "check_rate": sum(results) / len(results)}


SCORERS = {"squad": score_squad, "number": score_number, "checks": score_checks}
METRICS = {"squad": ["exact_match", "f1", "contains"], "number": ["exact_match"], "checks": ["pass", "check_rate"]}
