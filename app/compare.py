"""Challenger vs champion, as data: scores with intervals, the gate's checks, sample-level differences, curves.

Pure functions over stored artifacts (eval summaries, `eval/samples/<task>.jsonl`, gate reports, metric
histories); the Compare page draws what they return.
"""

from __future__ import annotations

import math

PASS_AT = 0.5  # a sample passes when its primary metric is at least this (exactly pass/fail for 0/1 metrics)
CURVES = ("loss", "val_loss", "tokens_per_s")


def default_z() -> float:
    from evaluation.config import GateConfig

    return GateConfig().z


def score_rows(label: str, summary: dict, z: float) -> list[dict]:
    """The gated units of one eval (general tasks, business dimensions) with value and interval."""
    from evaluation.gate import DIMENSION_SUITES, scores_of

    rows = []
    for name, s in sorted(scores_of(summary).items()):
        half = z * s.stderr
        rows.append({"model": label, "unit": name, "group": "business dimension" if s.suite in DIMENSION_SUITES
                     else "general task", "metric": s.metric, "value": s.value, "lo": max(0.0, s.value - half),
                     "hi": min(1.0, s.value + half), "stderr": s.stderr, "n": s.n})
    return rows


def check_rows(report: dict | None) -> list[dict]:
    """The gate report's checks as its delta table."""
    def num(v, signed=False):
        return "—" if v is None else (f"{v:+.3f}" if signed else f"{v:.3f}")

    rows = []
    for c in (report or {}).get("checks", []):
        interval = f"[{num(c.get('lo'), True)}, {num(c.get('hi'), True)}]" if c.get("lo") is not None else "—"
        rows.append({"check": c["name"], "against": c["against"], "rule": c["rule"],
                     "challenger": num(c.get("challenger")), "reference": num(c.get("reference")),
                     "delta": num(c.get("delta"), True), "interval": interval,
                     "result": "pass" if c["passed"] else "FAIL", "reason": c.get("reason") or ""})
    return rows


def task_metrics(summary: dict | None) -> dict[str, str]:
    """task name -> its primary metric, from an eval summary."""
    return {t["name"]: t["metric"] for t in (summary or {}).get("tasks", [])}


def _text(value) -> str:
    if isinstance(value, list | tuple):
        return " ".join(_text(v) for v in value if not isinstance(v, dict))
    return "" if value is None else str(value)


def sample_view(record: dict) -> dict:
    """Prompt, the model's output and the reference of one logged sample (generation or multiple choice)."""
    args = record.get("arguments") or []
    responses = record.get("response") or []
    prompt = _text(args[0][0]) if args and isinstance(args[0], list | tuple) and args[0] else _text(args)
    target = record.get("target")
    loglik = responses and all(isinstance(r, list | tuple) and r and isinstance(r[0], int | float)
                               for r in responses)
    if loglik:  # multiple choice: the answer is the choice with the highest log-likelihood
        choices = [_text(a[1]).strip() if isinstance(a, list | tuple) and len(a) > 1 else "?" for a in args]
        best = max(range(len(responses)), key=lambda i: responses[i][0])
        output = choices[best] if best < len(choices) else "?"
        reference = choices[target] if isinstance(target, int) and 0 <= target < len(choices) else _text(target)
    else:
        output = _text(responses[0] if responses else "")
        reference = _text(target)
    return {"prompt": prompt.strip(), "output": output.strip(), "reference": reference.strip()}


def _value(record: dict, metric: str) -> float | None:
    value = (record.get("metrics") or {}).get(metric)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def sample_diff(champion: list[dict], challenger: list[dict], metric: str) -> dict[str, list[dict]]:
    """Items the challenger newly fails or newly passes, matched by doc id, both outputs and the reference."""
    theirs = {r.get("doc_id"): r for r in champion}
    out: dict[str, list[dict]] = {"newly_failed": [], "newly_passed": []}
    for mine in challenger:
        other = theirs.get(mine.get("doc_id"))
        a, b = _value(other or {}, metric), _value(mine, metric)
        if other is None or a is None or b is None or (a >= PASS_AT) == (b >= PASS_AT):
            continue
        ours, old = sample_view(mine), sample_view(other)
        row = {"item": mine.get("item_id") or mine.get("doc_id"), "prompt": ours["prompt"],
               "reference": ours["reference"] or old["reference"], "champion output": old["output"],
               "challenger output": ours["output"], f"champion {metric}": a, f"challenger {metric}": b}
        out["newly_failed" if a >= PASS_AT else "newly_passed"].append(row)
    return out


def earlier_champions(entries: list, exclude: set[str]) -> list[str]:
    """Versions that held @production before, newest first (from the ledger's alias moves)."""
    seen: list[str] = []
    for e in reversed(entries):
        if e.alias == "production" and e.alias_after and e.alias_after not in seen and e.alias_after not in exclude:
            seen.append(e.alias_after)
    return seen


def curve_rows(label: str, histories: dict[str, list[tuple[int, float]]]) -> list[dict]:
    return [{"model": label, "metric": key, "step": step, "value": value}
            for key, points in histories.items() for step, value in points]


def markdown_table(rows: list[dict]) -> str:
    """Rows as a Markdown table whose cells wrap (long prompts and outputs stay readable side by side). Model
    output is escaped: it is shown as text, never interpreted as Markdown or HTML."""
    from app.ui import md

    def cell(value) -> str:
        return md(f"{value:.2f}" if isinstance(value, float) else str(value)[:600]) or " "

    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(r.get(k, "")) for k in header) + " |" for r in rows]
    return "\n".join(lines)
