"""Prometheus metrics of one server (its own registry, so several apps in one process never collide)."""

from __future__ import annotations

import json
import logging
import time

access_log = logging.getLogger("mlops.serve.access")

# Route labels are the route templates, never raw paths: a client cannot grow the label set.
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/{model}", "/health", "/ready",
          "/metrics", "/tokenize", "/detokenize", "/tokenizer_info")
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
