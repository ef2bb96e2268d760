"""Layer 5 (readers and the canary controller): the canary: a share of real traffic goes to a candidate for a while, watched, then promoted or rolled back.

`start` ledgers `canary_start` (the promote permission; a staging or candidate version; a champion in
production), which is what serving that follows the model reads to route `share` of its traffic to the
candidate. `watch` then reads the servers' Prometheus `/metrics` every `interval` seconds and compares what
each version served since the start: the candidate's 5xx share against `max_error_rate`, and its latency p95
against the champion's times `max_p95_ratio`. A crossed threshold stops the canary at once (`canary_stop`,
outcome `rolled_back`, the reason ledgered and tagged on the version, whose stage stays where it was); the
champion never stopped serving. When the time is up the candidate is promoted through the normal registry path
(approved request, gates); if that is refused, the canary stops with outcome `stopped` and the refusal says
what is missing. Each version is judged only once it served `min_requests` since the start.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mlops.identities import Identity, require
from registry.transition import Plan, RefusedError, run

log = logging.getLogger(__name__)
CANARY_TAG = "registry.canary"
REQUESTS = "mlops_serve_requests"
LATENCY = "mlops_serve_request_latency_seconds"
MODEL_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
MAX_READ_FAILURES = 3


# --------------------------------------------------------------------------- reading /metrics


@dataclass
class VersionStats:
    """What one version served: requests, 5xx errors, and its cumulative latency histogram (le -> count)."""

    requests: float = 0.0
    errors: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)

    def minus(self, before: VersionStats | None) -> VersionStats:
        if before is None:
            return self
        return VersionStats(self.requests - before.requests, self.errors - before.errors,
                            {le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()})

    def add(self, other: VersionStats) -> None:
        self.requests += other.requests
        self.errors += other.errors
        for le, n in other.buckets.items():
            self.buckets[le] = self.buckets.get(le, 0.0) + n

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests > 0 else 0.0

    def quantile(self, q: float) -> float | None:
        """Like Prometheus' histogram_quantile: linear within the bucket that holds the q-th observation."""
        bounds = sorted(self.buckets)
        total = self.buckets.get(float("inf"), self.buckets[bounds[-1]] if bounds else 0.0)
        if total <= 0:
            return None
        rank, lower, below = q * total, 0.0, 0.0
        for le in bounds:
            count = self.buckets[le]
            if count >= rank:
                if le == float("inf"):
                    return lower  # beyond the largest finite bucket: its bound is all that is known
                return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 1.0)
            lower, below = le, count
        return lower


def parse_metrics(text: str) -> dict[str, VersionStats]:
    """Per-version request, error and latency counts of the model routes from one /metrics text.

    Samples carry a `version` label; a server that labels none (one version only) is attributed to the version
    its `mlops_serve_model_info` names.
    """
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(text))
    if any(f.name == PER_VERSION_REQUESTS for f in families):
        return _per_version(families)
    serving = next((s.labels.get("version") for f in families if f.name == "mlops_serve_model_info"
                    for s in f.samples if s.value == 1), None)
    stats: dict[str, VersionStats] = {}

    def of(labels: dict) -> VersionStats | None:
        version = labels.get("version") or labels.get("model_version") or serving
        if version is None or labels.get("route", next(iter(MODEL_ROUTES))) not in MODEL_ROUTES:
            return None
        return stats.setdefault(version, VersionStats())

    for family in families:
        for sample in family.samples:
            if family.name == REQUESTS and sample.name == f"{REQUESTS}_total" and (v := of(sample.labels)):
                v.requests += sample.value
                if str(sample.labels.get("status", "")).startswith("5"):
                    v.errors += sample.value
            elif family.name == LATENCY and sample.name == f"{LATENCY}_bucket" and (v := of(sample.labels)):
                le = float(sample.labels["le"])
                v.buckets[le] = v.buckets.get(le, 0.0) + sample.value
    return stats


PER_VERSION_REQUESTS = "mlops_serve_version_requests"


def _per_version(families) -> dict[str, VersionStats]:
    """The server's per-version families (every role: user, canary), which split a canary's traffic from the
    champion's on one server."""
    stats: dict[str, VersionStats] = {}
    for family in families:
        for sample in family.samples:
            version = sample.labels.get("version")
            if version is None:
                continue
            v = stats.setdefault(version, VersionStats())
            if sample.name == f"{PER_VERSION_REQUESTS}_total":
                v.requests += sample.value
            elif sample.name == "mlops_serve_version_errors_total":
                v.errors += sample.value
            elif sample.name == "mlops_serve_version_request_latency_seconds_bucket":
                le = float(sample.labels["le"])
                v.buckets[le] = v.buckets.get(le, 0.0) + sample.value
    return stats


def metrics_reader(urls: list[str], api_key: str | None = None, timeout: float = 5.0) -> Callable[[], dict]:
    """A function reading every server's /metrics and summing them per version (replicas add up)."""
    import urllib.request

    def read() -> dict[str, VersionStats]:
        total: dict[str, VersionStats] = {}
        for url in urls:
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                for version, s in parse_metrics(resp.read().decode("utf-8")).items():
                    total.setdefault(version, VersionStats()).add(s)
        return total

    return read


# --------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class Limits:
    share: float
    seconds: float
    max_error_rate: float = 0.02
    max_p95_ratio: float = 1.5
    min_requests: int = 20
    interval: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise RefusedError(f"--share {self.share} must lie in (0, 1] (e.g. 0.1 for 10%).")
        if self.seconds <= 0:
            raise RefusedError(f"--for must be a positive duration, got {self.seconds} s.")


def parse_duration(text: str) -> float:
    """'10m', '90s', '1h30m' or plain seconds."""
    text = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise RefusedError(f"--for '{text}' is not a duration. Fix: write e.g. 10m, 90s, 1h30m or 600.")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def judge(since_start: dict[str, VersionStats], canary: str, champion: str, limits: Limits) -> tuple[str | None, dict]:
    """(why to roll back or None, what was observed) from the counts each version gathered since the start."""
    mine, theirs = since_start.get(canary, VersionStats()), since_start.get(champion, VersionStats())
    p95, p95_champion = mine.quantile(0.95), theirs.quantile(0.95)
    seen = {"canary_requests": mine.requests, "canary_errors": mine.errors, "canary_error_rate": mine.error_rate,
            "canary_p95_s": p95, "champion_requests": theirs.requests, "champion_p95_s": p95_champion}
    # Errors that would exceed the limit even if every request still needed succeeded count at once.
    if mine.requests < limits.min_requests and mine.errors <= limits.max_error_rate * limits.min_requests:
        return None, seen
    if mine.errors / max(mine.requests, limits.min_requests) > limits.max_error_rate:
        return (f"canary error rate {mine.error_rate:.1%} ({mine.errors:.0f} of {mine.requests:.0f}) exceeds "
                f"{limits.max_error_rate:.1%}"), seen
    if theirs.requests >= limits.min_requests and p95 and p95_champion:
        seen["p95_ratio"] = p95 / p95_champion
        if seen["p95_ratio"] > limits.max_p95_ratio:
            return (f"canary p95 latency {p95:.3f}s is {seen['p95_ratio']:.2f}x the champion's {p95_champion:.3f}s "
                    f"(limit {limits.max_p95_ratio:.2f}x)"), seen
    return None, seen


# --------------------------------------------------------------------------- ledgered acts


def governed_limits(limits: Limits, policy) -> Limits:
    """The thresholds of the recorded policy, whatever the caller asked for: only share, duration and the read
    interval are the caller's, and those within the policy's bounds (checked again by every verifier)."""
    from dataclasses import replace

    bounds = policy.canary
    if limits.share > bounds.max_share:
        raise RefusedError(f"--share {limits.share} exceeds the recorded policy's registry.canary.max_share "
                           f"{bounds.max_share}. Nothing was changed. Fix: ask for at most {bounds.max_share}, or an "
                           "admin records a policy that allows more (`mlops registry policy set`).")
    if limits.seconds > bounds.max_seconds:
        raise RefusedError(f"--for {limits.seconds:.0f}s exceeds the recorded policy's registry.canary.max_seconds "
                           f"{bounds.max_seconds:.0f}. Nothing was changed. Fix: ask for less.")
    return replace(limits, max_error_rate=bounds.max_error_rate, max_p95_ratio=bounds.max_p95_ratio,
                   min_requests=bounds.min_requests)


def start(actor: Identity, model: str, version: str, limits: Limits, *, now: float | None = None,
          url: str | None = None):
    """Start a canary of an approved production request (four-eyes already held at its approval), under the
    recorded policy's bounds and thresholds."""
    from registry.config import policy_of

    require(actor, "promote")
    begins = time.time() if now is None else now
    version = str(version)

    def plan_for(state) -> Plan:
        vs = state.versions.get(version)
        if vs is None or vs.stage not in ("staging", "candidate"):
            raise RefusedError(f"version {version} of '{model}' is {vs.stage if vs else 'not registered'}; a canary "
                               "runs a staging or candidate version. Nothing was changed.")
        champion = state.aliases.get("production")
        if champion is None:
            raise RefusedError(f"'{model}' has no production version, so there is no champion to keep serving the "
                               "rest of the traffic. Fix: promote a first version the normal way.")
        if state.canary:
            raise RefusedError(f"a canary of '{model}' already runs (v{state.canary['version']}, started by "
                               f"{state.canary.get('by')} at entry #{state.canary.get('seq')}). Fix: wait for it, or "
                               f"`mlops registry canary-stop {model} --reason ...`.")
        approved = state.approved_request(version, "production")
        if approved is None:
            raise RefusedError(f"version {version} of '{model}' has no approved request to production, so it may not "
                               "take real traffic. Nothing was changed. Fix: `mlops registry request "
                               f"{model} {version} --to production --comment ...`, then an approver other than its "
                               "trainer, registrar and requester approves it.")
        governed = governed_limits(limits, policy_of(state.policy))
        evidence = {"share": governed.share, "seconds": governed.seconds, "until": begins + governed.seconds,
                    "champion": champion, "request_seq": approved.seq,
                    "limits": {k: getattr(governed, k) for k in ("max_error_rate", "max_p95_ratio", "min_requests",
                                                                 "seconds", "interval")}}
        return Plan(entries=[dict(actor=actor.name, action="canary_start", model=model, version=version,
                                  reason=f"{governed.share:.0%} of traffic for {governed.seconds:.0f}s against "
                                         f"champion v{champion}", evidence=evidence)])

    return run(model, plan_for, url=url, actor=actor)[0]


def stop(actor: Identity, model: str, outcome: str, reason: str, *, evidence: dict | None = None,
         only_seq: int | None = None, url: str | None = None):
    """End the running canary (outcome promoted, rolled_back or stopped); ledgered, reason tagged on the version."""
    require(actor, "promote")
    if outcome not in ("promoted", "rolled_back", "stopped"):
        raise RefusedError(f"canary outcome '{outcome}' is not promoted, rolled_back or stopped.")
    if not reason or not reason.strip():
        raise RefusedError("stopping a canary needs a reason. Fix: pass --reason \"...\".")

    def plan_for(state) -> Plan:
        canary = state.canary
        if canary is None or (only_seq is not None and canary.get("seq") != only_seq):
            raise RefusedError(f"no canary of '{model}' is running (or it is not the one this controller started); "
                               "nothing was changed.")
        version = canary["version"]
        return Plan(entries=[dict(actor=actor.name, action="canary_stop", model=model, version=version,
                                  reason=reason, evidence={"outcome": outcome, "reason": reason,
                                                           "canary_seq": canary.get("seq"), **(evidence or {})})],
                    version_tags={version: {CANARY_TAG: f"{outcome}: {reason}"[:4000]}})

    # A stop moves no alias, so drift elsewhere in the registry must never keep traffic on a failing canary.
    return run(model, plan_for, url=url, actor=actor, repairing=True)[0]


def watch(actor: Identity, model: str, version: str, limits: Limits, read: Callable[[], dict], *,
          clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
          on_tick: Callable[[dict], None] | None = None, url: str | None = None) -> dict:
    """Start the canary, watch it, and end it: {"outcome", "reason", "observed", "entries"}."""
    from registry.audit import model_state

    begun = start(actor, model, version, limits, now=clock(), url=url)
    champion, deadline = begun.evidence["champion"], begun.evidence["until"]
    recorded = begun.evidence["limits"]  # the policy's thresholds, as ledgered
    limits = Limits(share=begun.evidence["share"], seconds=recorded["seconds"], interval=recorded["interval"],
                    **{k: recorded[k] for k in ("max_error_rate", "max_p95_ratio", "min_requests")})
    entries = [begun]

    def end(outcome: str, reason: str, seen: dict) -> dict:
        entries.append(stop(actor, model, outcome, reason, evidence={"observed": seen, "automatic": True},
                            only_seq=begun.seq, url=url))
        log.info("canary of %s v%s %s: %s", model, version, outcome, reason)
        return {"outcome": outcome, "reason": reason, "observed": seen, "entries": entries}

    try:
        baseline, failures, seen = read(), 0, {}
        while True:
            left = deadline - clock()
            if left <= 0:
                break
            sleep(min(limits.interval, left))
            state = model_state(model, url=url)
            if not state.canary or state.canary.get("seq") != begun.seq:
                return {"outcome": "ended_elsewhere", "reason": "the canary was stopped by another act",
                        "observed": seen, "entries": entries}
            if state.aliases.get("production") != champion:
                return end("stopped", f"production moved from v{champion} to "
                           f"v{state.aliases.get('production')} during the canary", seen)
            try:
                now = read()
                failures = 0
            except Exception as err:  # noqa: BLE001 - an unreadable server is judged after a few tries
                failures += 1
                if failures >= MAX_READ_FAILURES:
                    return end("stopped", f"/metrics could not be read {failures} times in a row ({err})", seen)
                continue
            reason, seen = judge(_since(now, baseline), version, champion, limits)
            if on_tick:
                on_tick(seen)
            if reason:
                return end("rolled_back", reason, seen)
        if seen.get("canary_requests", 0) < limits.min_requests:
            return end("stopped", f"the canary served {seen.get('canary_requests', 0):.0f} requests, fewer than "
                       f"the {limits.min_requests} needed to judge it; not promoted", seen)
        return _promote_at_end(actor, model, version, champion, seen, end, url)
    except KeyboardInterrupt:
        try:
            end("stopped", "the canary controller was interrupted", {})
        except RefusedError:
            pass  # it had already ended
        raise


def _since(now: dict[str, VersionStats], baseline: dict[str, VersionStats]) -> dict[str, VersionStats]:
    return {v: s.minus(baseline.get(v)) for v, s in now.items()}


def _promote_at_end(actor, model, version, champion, seen, end, url) -> dict:
    from registry.release import promote

    try:
        promoted = promote(actor, model, version, "production", expect_version=champion, url=url)
    except RefusedError as err:
        return end("stopped", f"the canary passed, but promotion was refused: {err}", seen)
    result = end("promoted", f"no threshold crossed; promoted as entry #{promoted.seq}", seen)
    result["entries"].insert(1, promoted)
    return result
