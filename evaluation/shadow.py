"""The shadow report: how a candidate's background answers compare with the answers users got.

Pure over the request log: each shadow row (`role='shadow'`) is paired with the user answer it shadowed
(`parent_id`). Figures: agreement (exact after whitespace normalisation, and word-overlap F1), length and
latency deltas, refusal rates (a phrase detector), errors on either side, and a win rate when a scorer is named.
A scorer judges a pair only when it has something to judge by; `reference_overlap` uses the corrections users
sent as feedback on the shadowed request, and says nothing about pairs without one.

`shadow_evidence(model, version)` is what the registry's shadow gate reads: `compared` (pairs where both sides
answered) is the number of shadowed requests that count as evidence.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from mlops.errors import ConfigError
from mlops.plugins import Registry

_WORD = re.compile(r"\w+", re.UNICODE)
_SPACE = re.compile(r"\s+")
REFUSALS = re.compile(
    r"\b(i\s*(?:'m| am)\s*(?:sorry|afraid)\b.{0,40}\b(?:can(?:no|')t|unable|not able)|i\s*(?:can(?:no|')t|"
    r"won't|will not|am unable to|'m unable to|am not able to|'m not able to)\s+(?:help|assist|answer|provide|"
    r"do that|comply|share)|as an ai\b|i must decline)",
    re.IGNORECASE,
)


@dataclass
class Pair:
    """One shadowed request: the prompt, the user's answer, the candidate's, and feedback on the user's."""

    request_id: str
    messages: list[dict]
    user: dict  # request log row
    shadow: dict
    feedback: list[dict]

    @property
    def both_answered(self) -> bool:
        return self.user["status"] == 200 and self.shadow["status"] == 200


# A scorer: Pair -> +1 (the candidate's answer is better), 0 (as good), -1 (worse), None (cannot judge).
SCORERS: Registry[Callable[[Pair], int | None]] = Registry("shadow scorer")


def normalise(text: str) -> str:
    return _SPACE.sub(" ", (text or "").strip())


def word_overlap(a: str, b: str) -> float:
    """F1 of the two texts' lower-cased words (1.0 for two empty texts)."""
    wa, wb = Counter(_WORD.findall((a or "").lower())), Counter(_WORD.findall((b or "").lower()))
    if not wa and not wb:
        return 1.0
    common = sum((wa & wb).values())
    if not common:
        return 0.0
    precision, recall = common / sum(wa.values()), common / sum(wb.values())
    return 2 * precision * recall / (precision + recall)


def is_refusal(text: str) -> bool:
    """A simple phrase detector on the start of an answer ("I'm sorry, but I can't ...", "As an AI ...")."""
    return bool(REFUSALS.search((text or "")[:300]))


@SCORERS.register("reference_overlap")
def reference_overlap(pair: Pair, margin: float = 0.05) -> int | None:
    """Closer to the user's correction (word overlap) wins; pairs nobody corrected are not judged."""
    corrections = [f["correction"] for f in pair.feedback if f.get("correction")]
    if not corrections:
        return None
    reference = corrections[-1]
    delta = word_overlap(pair.shadow["response"], reference) - word_overlap(pair.user["response"], reference)
    return 0 if abs(delta) < margin else (1 if delta > 0 else -1)


def pairs(model: str, version: str, *, since: float | None = None, url: str | None = None) -> tuple[list, int]:
    """(pairs, shadow rows without their user row) for a candidate version, oldest first."""
    from mlops.requestlog import read_feedback, read_requests

    shadows = read_requests(model=model, version=str(version), role="shadow", since=since, url=url)
    parents = {r["request_id"]: r for r in read_requests(request_ids=[s["parent_id"] for s in shadows if
                                                                       s["parent_id"]], url=url)}
    feedback: dict[str, list] = {}
    for f in read_feedback(request_ids=list(parents), url=url) if parents else []:
        feedback.setdefault(f["request_id"], []).append(f)
    out = [Pair(s["parent_id"], parents[s["parent_id"]]["messages"], parents[s["parent_id"]], s,
                feedback.get(s["parent_id"], [])) for s in shadows if s["parent_id"] in parents]
    return out, len(shadows) - len(out)


def shadow_evidence(model: str, version: str, *, since: float | None = None, scorer: str | None = None,
                    url: str | None = None) -> dict:
    """Counts and comparison figures of `version` shadowing live traffic (see the module docstring).

    Keys: model, version, since, shadowed (shadow rows), unpaired, compared (both answered), errors {user,
    shadow}, error_rate {user, shadow}, agreement {exact, token_overlap}, length {user_mean_tokens,
    shadow_mean_tokens, delta_mean_tokens, ratio}, latency_ms {user_p50, user_p95, shadow_p50, shadow_p95,
    delta_p50, delta_p95}, refusal_rate {user, shadow, delta}, champions {version: pairs}, win_rate (None
    without a scorer, else {scorer, judged, wins, ties, losses, rate}). Rates are None when nothing was compared.
    """
    found, unpaired = pairs(model, version, since=since, url=url)
    both = [p for p in found if p.both_answered]
    user_errors = sum(1 for p in found if p.user["status"] >= 500)
    shadow_errors = sum(1 for p in found if p.shadow["status"] != 200)
    report = {
        "model": model, "version": str(version), "since": since, "shadowed": len(found) + unpaired,
        "unpaired": unpaired, "compared": len(both),
        "errors": {"user": user_errors, "shadow": shadow_errors},
        "error_rate": {"user": _rate(user_errors, len(found)), "shadow": _rate(shadow_errors, len(found))},
        "champions": dict(Counter(p.user["version"] for p in found)),
        "agreement": {"exact": _mean([normalise(p.user["response"]) == normalise(p.shadow["response"]) for p in both]),
                      "token_overlap": _mean([word_overlap(p.user["response"], p.shadow["response"]) for p in both])},
        "length": _lengths(both), "latency_ms": _latencies(both),
        "refusal_rate": _refusals(both), "win_rate": _wins(both, scorer) if scorer else None,
    }
    return report


REPORT_PATH = "shadow/shadow_report.json"


def log_shadow_report(report: dict, experiment: str = "shadow") -> str:
    """Store the report as the evidence the registry's shadow gate reads (a `shadow` stage run naming the
    version it judged); returns the run id."""
    from mlops.lineage import Tag
    from mlops.tracking import tracked_run

    ref = f"models:/{report['model']}/{report['version']}"
    with tracked_run(experiment, run_name=f"shadow {ref}", attach_env_run=False,
                     tags={Tag.STAGE: "shadow", Tag.MODEL_REF: ref}) as run:
        run.log_dict(report, REPORT_PATH)
    attest_shadow_report(report, run.run_id)
    return run.run_id


def attest_shadow_report(report: dict, run_id: str) -> str | None:
    """Whoever stored the report signs it: the shadow gate counts only a report a permitted identity attested."""
    from registry.attest_store import attest_version
    from registry.entries import digest_of

    predicate = {"shadow_run": run_id, "shadowed": int(report.get("shadowed") or 0),
                 "errors": int((report.get("errors") or {}).get("shadow") or 0),
                 "agreement": json.loads(json.dumps(report.get("agreement") or {}, default=str)),
                 "report_sha256": digest_of(json.loads(json.dumps(report, default=str)))}
    return attest_version("shadow", report.get("model"), report.get("version"), predicate)


def _rate(n: int, total: int) -> float | None:
    return round(n / total, 4) if total else None


def _mean(values: list) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 1)


def _delta(a: float | None, b: float | None, digits: int = 1) -> float | None:
    return round(b - a, digits) if a is not None and b is not None else None


def _lengths(both: list[Pair]) -> dict:
    user = _mean([p.user["tokens_out"] or 0 for p in both])
    shadow = _mean([p.shadow["tokens_out"] or 0 for p in both])
    return {"user_mean_tokens": user, "shadow_mean_tokens": shadow, "delta_mean_tokens": _delta(user, shadow, 4),
            "ratio": round(shadow / user, 4) if user and shadow is not None else None}


def _latencies(both: list[Pair]) -> dict:
    out = {}
    for side in ("user", "shadow"):
        values = [getattr(p, side)["latency_ms"] or 0.0 for p in both]
        out[f"{side}_p50"], out[f"{side}_p95"] = _percentile(values, 50), _percentile(values, 95)
    out["delta_p50"], out["delta_p95"] = _delta(out["user_p50"], out["shadow_p50"]), \
        _delta(out["user_p95"], out["shadow_p95"])
    return out


def _refusals(both: list[Pair]) -> dict:
    user = _mean([is_refusal(p.user["response"]) for p in both])
    shadow = _mean([is_refusal(p.shadow["response"]) for p in both])
    return {"user": user, "shadow": shadow, "delta": _delta(user, shadow, 4)}


def _wins(both: list[Pair], scorer: str) -> dict:
    judge = SCORERS.get(scorer)
    verdicts = [v for v in (judge(p) for p in both) if v is not None]
    wins, ties, losses = verdicts.count(1), verdicts.count(0), verdicts.count(-1)
    return {"scorer": scorer, "judged": len(verdicts), "wins": wins, "ties": ties, "losses": losses,
            "rate": _rate(wins + 0.5 * ties, len(verdicts))}


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(value: str | None, now: float | None = None) -> float | None:
    """`24h`, `7d`, `30m` (ago), an ISO date or time (UTC unless it says otherwise), or epoch seconds."""
    if value is None or not value.strip():
        return None
    text, now = value.strip(), time.time() if now is None else now
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text):
        return now - float(m[1]) * _UNITS[m[2]]
    try:
        return float(text)
    except ValueError:
        pass
    from datetime import UTC, datetime

    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--since '{value}' is not a time. Fix: pass an age such as 24h or 7d, an ISO time such "
                          "as 2026-12-01T09:00, or epoch seconds.") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def render(report: dict) -> str:
    """The report as a short table for a terminal."""
    lines = [f"shadow report for {report['model']} version {report['version']}: {report['shadowed']} shadowed, "
             f"{report['compared']} compared (both answered), {report['unpaired']} without their user row"]
    if report["champions"]:
        lines.append("  against: " + ", ".join(f"version {v} ({n})" for v, n in sorted(report["champions"].items())))
    rows = [("agreement exact", report["agreement"]["exact"]), ("agreement word F1", report["agreement"]["token_overlap"]),
            ("errors user / shadow", f"{report['errors']['user']} / {report['errors']['shadow']}"),
            ("mean tokens user / shadow", f"{report['length']['user_mean_tokens']} / "
             f"{report['length']['shadow_mean_tokens']}"),
            ("latency p50 ms user / shadow", f"{report['latency_ms']['user_p50']} / {report['latency_ms']['shadow_p50']}"),
            ("latency p95 ms user / shadow", f"{report['latency_ms']['user_p95']} / {report['latency_ms']['shadow_p95']}"),
            ("refusal rate user / shadow", f"{report['refusal_rate']['user']} / {report['refusal_rate']['shadow']}")]
    if report["win_rate"] is not None:
        w = report["win_rate"]
        rows.append((f"win rate ({w['scorer']})", f"{w['rate']} over {w['judged']} judged: {w['wins']} won, "
                     f"{w['ties']} tied, {w['losses']} lost"))
    lines += [f"  {name:30} {value}" for name, value in rows]
    lines.append("  (shadow latency excludes the time the shadow stood aside for user traffic)")
    return "\n".join(lines)
