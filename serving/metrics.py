"""Prometheus metrics of one server (its own registry, so several apps in one process never collide)."""

from __future__ import annotations

import json
import logging
import time

access_log = logging.getLogger("mlops.serve.access")

# Route labels are the route templates, never raw paths: a client cannot grow the label set.
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/{model}", "/health", "/ready",
          "/metrics", "/tokenize", "/detokenize", "/tokenizer_info", "/v1/feedback")
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def route_label(path: str) -> str:
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return "unmatched"


class ServerMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("mlops_serve_requests", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("mlops_serve_request_latency_seconds", "request latency, first byte in to last out",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("mlops_serve_time_to_first_token_seconds", "request start to first generated token",
                              ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("mlops_serve_prompt_tokens", "prompt tokens of answered requests", ["route"],
                                     registry=r)
        self.completion_tokens = Counter("mlops_serve_completion_tokens", "generated tokens of answered requests",
                                         ["route"], registry=r)
        self.inflight = Gauge("mlops_serve_requests_in_flight", "requests being served", registry=r)
        self.queue_depth = Gauge("mlops_serve_queue_depth", "requests waiting for the engine", registry=r)
        self.batch_size = Histogram("mlops_serve_batch_size", "rows per engine batch", ["kind"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.model_info = Gauge("mlops_serve_model_info", "the model version serving new requests (value 1)",
                                ["model", "version", "profile_hash"], registry=r)
        self.swaps = Counter("mlops_serve_model_swaps", "model versions swapped in", registry=r)
        # Per version, generation routes only: what a canary controller compares (see `version_stats`).
        self.version_requests = Counter("mlops_serve_version_requests", "generation requests by the version that "
                                        "answered, its role (user, canary) and status", ["version", "role", "status"],
                                        registry=r)
        self.version_errors = Counter("mlops_serve_version_errors", "generation requests that failed on the server "
                                      "(a 5xx, or a stream that broke after its 200), by version", ["version", "role"],
                                      registry=r)
        self.version_latency = Histogram("mlops_serve_version_request_latency_seconds", "generation request latency "
                                         "by version", ["version", "role"], buckets=LATENCY_BUCKETS, registry=r)
        self.canary_share = Gauge("mlops_serve_canary_share", "share of user requests routed to the canary version",
                                  ["version"], registry=r)
        self.shadow_requests = Counter("mlops_serve_shadow_requests", "shadow answers by outcome (answered, failed, "
                                       "timed_out, dropped_busy, dropped_draining)", ["version", "outcome"],
                                       registry=r)
        self.shadow_pending = Gauge("mlops_serve_shadow_pending", "shadow requests queued or running", registry=r)
        self.shadow_latency = Histogram("mlops_serve_shadow_latency_seconds", "shadow answer latency, time yielded "
                                        "to user traffic excluded", ["version"], buckets=LATENCY_BUCKETS, registry=r)
        self.request_log_rows = Counter("mlops_serve_request_log_rows", "request log rows by outcome (written, "
                                        "dropped_full, duplicate, write_error; at exit spooled, lost_at_exit)", ["outcome"], registry=r)
        self.feedback = Counter("mlops_serve_feedback", "ratings by outcome (stored: on a written trace; "
                                "written_behind: right after its queued answer's trace; lost: that trace or the "
                                "rating failed)", ["outcome"], registry=r)
        self._served: tuple | None = None

    def watch_slot(self, slot) -> None:
        self.queue_depth.set_function(lambda: _queue_depth(slot))
        slot.listeners.append(lambda serving: self.serving_changed(slot.name, serving))
        if slot.current is not None:
            self.serving_changed(slot.name, slot.current, initial=True)

    def serving_changed(self, name: str, serving, initial: bool = False) -> None:
        labels = (name, serving.version, serving.profile.profile_hash())
        if self._served is not None:
            self.model_info.remove(*self._served)
        self.model_info.labels(*labels).set(1)
        self._served = labels
        if not initial:
            self.swaps.inc()
        try:
            serving.engine.observer = lambda kind, rows, _tokens: self.batch_size.labels(kind).observe(rows)
        except AttributeError:  # an engine without batch reports
            pass

    def observe(self, record: dict) -> None:
        route = record["route"]
        self.requests.labels(route, record["method"], str(record["status"])).inc()
        self.latency.labels(route).observe(record["latency_ms"] / 1000)
        if record.get("ttft_ms") is not None:
            self.ttft.labels(route).observe(record["ttft_ms"] / 1000)
        if record.get("prompt_tokens"):
            self.prompt_tokens.labels(route).inc(record["prompt_tokens"])
        if record.get("completion_tokens"):
            self.completion_tokens.labels(route).inc(record["completion_tokens"])
        version = record.get("model_version")
        if version and route in GENERATION_ROUTES:
            role = record.get("role") or "user"
            self.version_requests.labels(version, role, str(record["status"])).inc()
            self.version_latency.labels(version, role).observe(record["latency_ms"] / 1000)
            if record["status"] >= 500 or record.get("failed"):
                self.version_errors.labels(version, role).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _queue_depth(slot) -> float:
    serving = slot.current
    depth = getattr(serving.engine, "queue_depth", None) if serving else None
    return float(depth()) if depth else 0.0


def log_access(record: dict) -> None:
    """One JSON line per request: request id, route, status, tokens, latency."""
    access_log.info(json.dumps(record, separators=(",", ":"), default=str))


def now_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def version_stats(text: str, before: str | None = None) -> dict[str, dict]:
    """Per-version figures from a `/metrics` scrape (minus an earlier scrape `before`, for a window):
    {version: {"requests", "errors", "error_rate", "p95_seconds", "by_role": {role: requests}}}.

    Errors are server failures (5xx, or a stream that broke after its 200); a client's own mistakes (4xx) and
    disconnects (499) say nothing about a version.
    p95 is read from the latency histogram as Prometheus' `histogram_quantile` does (linear within a bucket).
    """
    now, then = _version_samples(text), _version_samples(before) if before else {}
    out: dict[str, dict] = {}
    for version, figures in now.items():
        old = then.get(version, {})
        by_role = {role: n - old.get("by_role", {}).get(role, 0) for role, n in figures["by_role"].items()}
        requests = sum(by_role.values())
        errors = figures["errors"] - old.get("errors", 0)
        buckets = {le: n - old.get("buckets", {}).get(le, 0) for le, n in figures["buckets"].items()}
        out[version] = {"requests": requests, "errors": errors, "error_rate": errors / requests if requests else 0.0,
                        "p95_seconds": _quantile(0.95, buckets), "by_role": by_role}
    return out


def _version_samples(text: str) -> dict[str, dict]:
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, dict] = {}

    def entry(version: str) -> dict:
        return found.setdefault(version, {"by_role": {}, "errors": 0.0, "buckets": {}})

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "mlops_serve_version_requests_total":
                roles = entry(labels["version"])["by_role"]
                roles[labels["role"]] = roles.get(labels["role"], 0) + sample.value
            elif sample.name == "mlops_serve_version_errors_total":
                entry(labels["version"])["errors"] += sample.value
            elif sample.name == "mlops_serve_version_request_latency_seconds_bucket":
                buckets = entry(labels["version"])["buckets"]
                le = float(labels["le"])
                buckets[le] = buckets.get(le, 0) + sample.value
    return found


def _quantile(q: float, buckets: dict[float, float]) -> float | None:
    """`histogram_quantile` over cumulative bucket counts {upper bound: count}; None without observations."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower  # beyond the largest finite bucket: its bound is all that is known
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower
