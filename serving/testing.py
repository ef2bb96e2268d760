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
    """A canary as `mlops registry canary` starts it, through the governed path: gate evidence, a request by tina
    approved by bob (four-eyes), a recorded policy that allows `share`, then `registry.canary.start`."""
    import tempfile
    import time
    from pathlib import Path

    import yaml

    from registry.audit import model_state
    from registry.canary import Limits, start
    from registry.config import policy_of
    from registry.identities import set_policy
    from registry.release import decide, request
    from registry.testing import gate_evidence, signed_in

    state = model_state(model)
    if state.approved_request(str(version), "production") is None:
        champion = state.aliases.get("production")
        gate_evidence(model, str(version), champion=(champion, state.versions[champion].content_id))
        if state.open_request(str(version), "production") is None:
            request(signed_in("tina"), model, str(version), "production", "canary it first")
        decide(signed_in("bob"), model, str(version), "approved for a canary", approve=True)
    policy = policy_of(state.policy).model_dump(mode="json")
    if policy["canary"]["max_share"] < share:
        policy["canary"]["max_share"] = share
        path = Path(tempfile.mkdtemp()) / "release.yaml"
        path.write_text(yaml.safe_dump({"registry": policy}))
        set_policy(signed_in("admin"), path)
    start(signed_in(actor), model, str(version), Limits(share=share, seconds=max(until - time.time(), 1.0)))


def canary_stop(model: str, version: str, outcome: str = "rolled_back", actor: str = "alice") -> None:
    """The ledgered end of the running canary (`outcome`: promoted, rolled_back or stopped)."""
    from registry.canary import stop
    from registry.testing import signed_in

    stop(signed_in(actor), model, outcome, "test")
