"""Running the app under uvicorn with a bounded drain: SIGTERM stops new connections, lets running requests
finish for up to `serve.drain_timeout` seconds, cuts the rest, and the process exits 0 when nothing was cut
(uvicorn's own handler re-raises the signal after shutdown, which makes every clean stop exit with -15).
"""

from __future__ import annotations

import logging
import signal

log = logging.getLogger("mlops.serve")


def run_until_signal(app, *, host: str, port: int, drain_timeout: float) -> int:
    import uvicorn

    ctx = app.state.ctx

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop now
                return
            if not self.should_exit:
                log.info("received %s: no new connections; draining %d running request(s) for up to %.0f s",
                         signal.Signals(sig).name, ctx.slot.inflight(), drain_timeout)
            ctx.draining = True
            self.should_exit = True

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=drain_timeout)
    server = DrainingServer(config)
    server.run()
    if ctx.cut:
        log.error("the drain timeout (%.0f s) cut %d request(s) short", drain_timeout, ctx.cut)
        return 1
    if server.started:
        log.info("drained cleanly; exiting")
    return 0 if server.started else 1
