"""Test helpers: run the OpenAI-compatible app in a background thread of the test process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serve_in_thread(app, start_timeout: float = 60.0) -> Iterator[str]:
    """Serve `app` with uvicorn on a free local port; yields the base URL and stops the server on exit."""
    import uvicorn

    from mlops.files import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        raise RuntimeError(f"uvicorn did not start on port {port} within {start_timeout} s")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def canary_start(model: str, version: str, share: float, until: float, actor: str = "alice") -> None:
    """The ledger entry `mlops registry canary` writes when a canary starts (serving tests write it directly)."""
    from registry.transition import Plan, run

    run(model, lambda _state: Plan(entries=[dict(actor=actor, action="canary_start", model=model, version=str(version),
                                                 evidence={"share": share, "until": until}, reason="canary")]))


def canary_stop(model: str, version: str, outcome: str = "rolled_back", actor: str = "alice") -> None:
    """The ledger entry that ends a canary (`outcome`: promoted, rolled_back or stopped)."""
    from registry.transition import Plan, run

    run(model, lambda _state: Plan(entries=[dict(actor=actor, action="canary_stop", model=model, version=str(version),
                                                 evidence={"outcome": outcome, "reason": "test"}, reason=outcome)]))
