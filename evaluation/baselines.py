"""Trivial baselines: how well a rule that never reads the question's meaning would score on a suite.

A multiple-choice task measures knowledge only if picking the longest, the shortest, the first or the last
choice, or the choice sharing the most words with the question, scores about chance. Ties share the credit
(a rule that cannot decide between k choices is right 1/k of the time). Generation targets must not be
spelled out in their own prompts. Each suite states its margin (`baseline_margin` in suite.yaml);
`tests/test_eval_suite_baselines.py` holds every task to it and CALIBRATION.md reports the figures.
"""

from __future__ import annotations

from collections.abc import Callable

from mlops.data.decontam import FUNCTION_WORDS, leak_words

Rule = Callable[[dict, int], float]  # (item, choice index) -> score; the highest score is picked


def _overlap(content: bool) -> Rule:
    def score(item: dict, i: int) -> float:
        question = set(leak_words(item["prompt"]))
        if content:
            question -= FUNCTION_WORDS
        return len(question & set(leak_words(item["choices"][i])))

    return score


RULES: dict[str, Rule] = {
    "longest": lambda item, i: len(item["choices"][i]),
    "shortest": lambda item, i: -len(item["choices"][i]),
    "first": lambda item, i: -i,
    "last": lambda item, i: i,
    "word_overlap": _overlap(content=False),
    "content_word_overlap": _overlap(content=True),
}


def chance(items: list[dict]) -> float:
    return sum(1 / len(item["choices"]) for item in items) / len(items)


def rule_accuracy(items: list[dict], rule: Rule) -> float:
    """Expected accuracy of always picking the choice the rule scores highest (ties split evenly)."""
    total = 0.0
    for item in items:
        scores = [rule(item, i) for i in range(len(item["choices"]))]
        best = [i for i, s in enumerate(scores) if s == max(scores)]
        total += (item["answer"] in best) / len(best)
    return total / len(items)


def answer_positions(items: list[dict]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for item in items:
        counts[item["answer"]] = counts.get(item["answer"], 0) + 1
    return dict(sorted(counts.items()))


def mc_baselines(items: list[dict], margin: float) -> dict:
    """Chance, every rule's accuracy, and the rules outside chance +/- margin."""
    base = chance(items)
    rules = {name: round(rule_accuracy(items, rule), 4) for name, rule in RULES.items()}
    return {"n": len(items), "chance": round(base, 4), "margin": margin, "rules": rules,
            "positions": answer_positions(items),
            "outside": sorted(name for name, acc in rules.items() if abs(acc - base) > margin)}


def _contains(haystack: list[str], needle: list[str]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def targets_in_prompt(items: list[dict]) -> list[tuple[str, str]]:
    """(item id, answer) for every accepted answer whose words appear, in order, in its own prompt."""
    found = []
    for item in items:
        prompt = leak_words(item["prompt"])
        for answer in [item.get("target"), *(item.get("aliases") or [])]:
            words = leak_words(str(answer)) if answer is not None else []
            if words and _contains(prompt, words):
                found.append((str(item.get("id")), str(answer)))
    return found


def suite_baselines(suite) -> dict[str, dict]:
    """Per multiple-choice task of a suite: its baseline figures (see `mc_baselines`)."""
    return {task.name: mc_baselines(task.items(), suite.baseline_margin)
            for task in suite.tasks if task.kind == "multiple_choice"}
