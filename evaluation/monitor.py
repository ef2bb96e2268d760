"""Quality over time (pure): per version and per day, the signals of served answers, each with its interval, and
the alerts of the recorded policy (`registry.monitor`).

Signals of one served answer (roles `user` and `canary`: answers someone saw; a shadow's never reached anyone):
- thumbs_down: its newest rating is -1;      correction: some feedback on it carries a correction;
- refusal: the answer opens with one of `REFUSAL_PATTERNS` (a short, explicit list, matched in its first
  `REFUSAL_HEAD` characters, case-insensitively), judged on answers that did not fail;
- repeat: the same API key (`key`) asked a near-duplicate question within `repeat_window_seconds` after it:
  the answer did not settle the question. Near-duplicate means the data pipeline's own test: the same normalised
  text (`mlops.data.dedup.normalise`), or MinHash similarity of word shingles at or above `repeat_similarity`.
  Answers without a key are not judged (they count in no denominator of this signal);
- error: a 5xx, or an error after a 200 (a stream that broke); a client's 4xx is not the model's error;
- latency: p50 and p95 of the end-to-end latency of answers that did not fail.

Rates get Wilson score intervals; latency quantiles get order-statistic (binomial) intervals, at the policy's
`confidence`. A signal alerts when its recent days (`recent_days`) are worse than a reference by more than both
intervals (they do not overlap) AND by more than the policy's tolerance; the references are the version's own
first `baseline_days` of traffic and the previous champion's last `baseline_days` as champion.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from mlops.errors import MLOpsError

DAY = 86400.0
SERVED_ROLES = ("user", "canary")
RATES = ("thumbs_down", "correction", "refusal", "repeat", "error")
QUANTILES = {"latency_p50": 0.5, "latency_p95": 0.95}
TOLERANCE = {"thumbs_down": "max_thumbs_down_increase", "correction": "max_correction_increase",
             "refusal": "max_refusal_increase", "repeat": "max_repeat_increase", "error": "max_error_increase"}
# Openings of a refusal in English support answers. Explicit on purpose: what counts as a refusal is reviewable,
# and a change to this list is a change of the signal (the README lists it).
REFUSAL_PATTERNS = (
    r"i(?:'m| am) sorry,? but",
    r"i(?:'m| am) (?:not able|unable) to",
    r"i (?:can(?:'|no)t|cannot|won't|will not) (?:help|assist|answer|provide|do|comply|share)",
    r"(?:sorry|unfortunately),? i (?:can(?:'|no)t|cannot)",
    r"as an ai\b",
    r"i(?:'m| am) not (?:allowed|permitted) to",
)
REFUSAL_HEAD = 200
_REFUSAL_RE = re.compile("|".join(f"(?:{p})" for p in REFUSAL_PATTERNS), re.IGNORECASE)
REPEAT_SHINGLE = 2  # questions are short: word pairs, not the data pipeline's 3-word shingles
REPEAT_PERMUTATIONS = 64


@dataclass
class Answer:
    request_id: str
    version: str
    ts: float
    key: str | None
    question: str
    thumbs_down: bool = False
    correction: bool = False
    refusal: bool = False
    repeat: bool | None = None  # None: no key, not judged
    error: bool = False
    latency_ms: float | None = None

    @property
    def day(self) -> str:
        return datetime.fromtimestamp(self.ts, UTC).strftime("%Y-%m-%d")


def is_refusal(text: str | None) -> bool:
    return bool(text) and _REFUSAL_RE.search(text[:REFUSAL_HEAD].replace("\u2019", "'")) is not None


def failed(row: dict) -> bool:
    status = int(row.get("status") or 200)
    return status >= 500 or (status < 400 and bool(row.get("error")))


def question_of(messages) -> str:
    users = [m.get("content") or "" for m in messages or () if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def answers_of(requests: list[dict], feedback: list[dict], *, window_seconds: float,
               similarity: float) -> list[Answer]:
    """One `Answer` per served row (user and canary roles), its signals set from its feedback and its key's
    later questions."""
    by_request: dict[str, list[dict]] = {}
    for fb in sorted(feedback, key=lambda f: f["ts"]):
        by_request.setdefault(fb["request_id"], []).append(fb)
    out = []
    for row in sorted(requests, key=lambda r: r["ts"]):
        if row.get("role", "user") not in SERVED_ROLES:
            continue
        fbs = by_request.get(row["request_id"], [])
        bad = failed(row)
        out.append(Answer(
            request_id=row["request_id"], version=str(row["version"]), ts=float(row["ts"]), key=row.get("key"),
            question=question_of(row.get("messages")), thumbs_down=bool(fbs) and fbs[-1]["rating"] < 0,
            correction=any((f.get("correction") or "").strip() for f in fbs),
            refusal=not bad and int(row.get("status") or 200) < 400 and is_refusal(row.get("response")),
            error=bad, latency_ms=None if bad or row.get("latency_ms") is None else float(row["latency_ms"])))
    mark_repeats(out, window_seconds=window_seconds, similarity=similarity)
    return out


def mark_repeats(answers: list[Answer], *, window_seconds: float, similarity: float) -> None:
    """Set `repeat` on each keyed answer: True when its key asked a near-duplicate within the window after it."""
    from mlops.data.dedup import normalise, signature
    from mlops.data.dedup import similarity as estimated

    by_key: dict[str, list[Answer]] = {}
    for a in answers:
        if a.key:
            by_key.setdefault(a.key, []).append(a)
    known: dict[str, object] = {}  # the same question is asked often: its signature is computed once
    for asked in by_key.values():
        texts = [normalise(a.question) for a in asked]
        for t in texts:
            if t and t not in known:
                known[t] = signature(t, REPEAT_PERMUTATIONS, REPEAT_SHINGLE)
        sigs = [known.get(t) for t in texts]
        for i, a in enumerate(asked):
            a.repeat = False
            for j in range(i + 1, len(asked)):
                if asked[j].ts - a.ts > window_seconds:
                    break
                if texts[i] and (texts[i] == texts[j] or estimated(sigs[i], sigs[j]) >= similarity):
                    a.repeat = True
                    break


# --------------------------------------------------------------------------- intervals


def z_of(confidence: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf((1 + confidence) / 2)


def wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    z = z_of(confidence)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # at k = 0 (or n) the bound is exactly 0 (or 1); float rounding must not make it look like a rise
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def quantile_interval(values: list[float], q: float, confidence: float) -> tuple[float, float, float] | None:
    """(estimate, low, high) of the q-quantile: the order statistics whose ranks bound it at `confidence`
    (normal approximation of the binomial count below the quantile); None without values."""
    if not values:
        return None
    xs = sorted(values)
    n = len(xs)
    z = z_of(confidence)
    half = z * math.sqrt(n * q * (1 - q))
    low = max(0, math.floor(n * q - half) - 1)
    high = min(n - 1, math.ceil(n * q + half))
    estimate = xs[min(n - 1, max(0, math.ceil(n * q) - 1))]
    return estimate, xs[low], xs[high]


def summary(answers: list[Answer], confidence: float) -> dict:
    """Each rate as {k, n, rate, low, high}; each latency quantile as {value, low, high, n} (None: no data)."""
    out: dict = {"requests": len(answers)}
    for name in RATES:
        judged = [getattr(a, name) for a in answers if getattr(a, name) is not None]
        if name == "refusal":
            judged = [a.refusal for a in answers if not a.error]
        k, n = sum(judged), len(judged)
        low, high = wilson(k, n, confidence)
        out[name] = {"k": k, "n": n, "rate": k / n if n else None, "low": low, "high": high}
    latencies = [a.latency_ms for a in answers if a.latency_ms is not None]
    for name, q in QUANTILES.items():
        found = quantile_interval(latencies, q, confidence)
        out[name] = None if found is None else {"value": found[0], "low": found[1], "high": found[2],
                                                 "n": len(latencies)}
    return out


# --------------------------------------------------------------------------- champions and comparisons


def champion_periods(entries) -> list[tuple[str, float, float | None]]:
    """(version, from, until) of each production holder, oldest first, from the ledger's promote and rollback
    entries (epoch seconds; until None: holds it now)."""
    periods: list[list] = []
    for e in entries:
        if e.alias != "production" or e.action not in ("promote", "rollback"):
            continue
        at = datetime.fromisoformat(e.ts.replace("Z", "+00:00")).timestamp()
        if periods and periods[-1][2] is None:
            periods[-1][2] = at
        if e.alias_after:
            periods.append([str(e.alias_after), at, None])
    return [tuple(p) for p in periods]


def previous_champion(version: str, periods) -> tuple[str, float, float] | None:
    """The champion `version` is judged against: for the production holder, the one before its latest period;
    for any other version (a canary, a candidate), the holder now. (version, from, until) or None."""
    if not periods:
        return None
    current = periods[-1]
    if current[0] != version:
        return (current[0], current[1], math.inf) if current[2] is None else None
    earlier = [p for p in periods[:-1] if p[0] != version]
    return earlier[-1] if earlier else None


def compare(recent: dict, reference: dict, policy) -> list[dict]:
    """The signals of `recent` worse than `reference` beyond both intervals and the policy's tolerance."""
    found = []
    for name in RATES:
        now, ref = recent[name], reference[name]
        if min(now["n"], ref["n"]) < policy.min_requests:
            continue
        tolerance = getattr(policy, TOLERANCE[name])
        if now["low"] > ref["high"] and now["rate"] - ref["rate"] > tolerance:
            found.append({"signal": name, "recent": now["rate"], "reference_value": ref["rate"],
                          "recent_interval": [now["low"], now["high"]], "reference_interval": [ref["low"],
                                                                                              ref["high"]],
                          "tolerance": tolerance, "field": f"registry.monitor.{TOLERANCE[name]}"})
    now, ref = recent["latency_p95"], reference["latency_p95"]
    if now and ref and min(now["n"], ref["n"]) >= policy.min_requests and ref["value"] > 0:
        ratio = now["value"] / ref["value"]
        if now["low"] > ref["high"] and ratio > policy.max_p95_ratio:
            found.append({"signal": "latency_p95", "recent": now["value"], "reference_value": ref["value"],
                          "recent_interval": [now["low"], now["high"]], "reference_interval": [ref["low"],
                                                                                              ref["high"]],
                          "tolerance": policy.max_p95_ratio, "field": "registry.monitor.max_p95_ratio"})
    return found


# --------------------------------------------------------------------------- the report


def version_order(version: str) -> tuple:
    return (0, int(version), "") if version.isdigit() else (1, 0, version)


def report(model: str, answers: list[Answer], *, policy, periods, now: float, days: int) -> dict:
    """Per version: a row per day, the recent days, and the comparison with each reference; the alerts.
    `answers` holds the window's answers and the references' (the versions' first days, the champion's)."""
    since, recent_since = now - days * DAY, now - policy.recent_days * DAY
    by_version: dict[str, list[Answer]] = {}
    for a in sorted(answers, key=lambda a: a.ts):
        by_version.setdefault(a.version, []).append(a)
    shown = sorted({a.version for a in answers if since <= a.ts <= now}, key=version_order)
    if not shown:
        raise NoTraffic(model, since, now)
    out = {"model": model, "window": {"since": since, "until": now, "days": days,
                                      "recent_since": recent_since}, "versions": {}, "alerts": [], "notices": []}
    for version in shown:
        rows = by_version[version]
        in_window = [a for a in rows if since <= a.ts <= now]
        per_day: dict[str, list[Answer]] = {}
        for a in in_window:
            per_day.setdefault(a.day, []).append(a)
        entry = {"days": {day: summary(items, policy.confidence) for day, items in sorted(per_day.items())},
                 "recent": summary([a for a in rows if recent_since <= a.ts <= now], policy.confidence),
                 "references": {}}
        for name, ref_version, ref_rows, why_not in references(version, rows, by_version, policy=policy,
                                                               periods=periods, recent_since=recent_since):
            if why_not:
                out["notices"].append(f"v{version} vs {name}: {why_not}")
                continue
            ref = summary(ref_rows, policy.confidence)
            entry["references"][name] = {"version": ref_version, **ref}
            for found in compare(entry["recent"], ref, policy):
                out["alerts"].append({"model": model, "version": version, "reference": name,
                                      "reference_version": ref_version, **found})
        out["versions"][version] = entry
    return out


def references(version: str, rows: list[Answer], by_version: dict[str, list[Answer]], *, policy, periods,
               recent_since: float):
    """(name, version, answers, why not) for the version's first days and for the previous champion."""
    span = policy.baseline_days * DAY
    first_end = rows[0].ts + span
    if first_end > recent_since:
        yield "first_week", version, [], (f"its first {policy.baseline_days} days of traffic overlap the recent "
                                          f"{policy.recent_days} days; it is judged once they are over")
    else:
        yield "first_week", version, [a for a in rows if a.ts < first_end], None
    champion = previous_champion(version, periods)
    if champion is None:
        yield "previous_champion", None, [], "the ledger names no earlier champion"
        return
    held, start, until = champion
    end = min(until, recent_since)  # the champion's own days, never the days being judged
    chosen = [a for a in by_version.get(held, []) if start <= a.ts < end and a.ts >= end - span]
    if not chosen:
        yield "previous_champion", held, [], f"v{held} has no served traffic logged as champion"
    else:
        yield "previous_champion", held, chosen, None


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NoTraffic(MLOpsError):
    """The monitor window holds no served answer of the model (exit 3, so cron tells it from an alert)."""

    exit_code = 3

    def __init__(self, model: str, since: float, until: float) -> None:
        self.model, self.since, self.until = model, since, until
        super().__init__(
            f"no served traffic of '{model}' between {_iso(since)} and {_iso(until)} ({(until - since) / DAY:.0f} "
            "days): nothing to judge, so nothing is reported as healthy. Fix: widen the window (--days), check the "
            "model name serving answers under (`mlops serve` logs each answer with it), or that serving writes the "
            "request log this command reads (MLOPS_REQUEST_LOG_DB / the registry's database).")
