"""The request log's MLflow writes in a child process of lower priority than the gateway.

Writing a trace is Python work (the PII scrubber, MLflow's ORM): on the gateway's own thread it competes for the
interpreter lock with the event loop and the engine, and measured 70% of the throughput on a busy 2-core machine
(benchmarks/RESULTS.md, issue 31). In a process of its own, niced below the gateway, it competes for nothing the
gateway holds. Where the gateway may raise it again (`can_leave_idle`), the child writes at SCHED_IDLE while its
backlog is younger than the idle lag (`pace`): it then runs only on CPU time nothing else wants. The parent's
writer thread sends batches of rows over a pipe and waits for the request ids skipped
(already traced); a child that dies or hangs is replaced on the next batch, and that batch counts as lost.

Started as `python -c` (not `multiprocessing`): spawn would re-run the server's `__main__`, fork would copy a process
full of threads.
"""

from __future__ import annotations

import os
import subprocess
import sys

NICE = 10
CAP_SYS_NICE = 23


def can_leave_idle() -> bool:
    """Whether this process may move a child from SCHED_IDLE back to SCHED_OTHER at NICE: that needs CAP_SYS_NICE
    or an RLIMIT_NICE of at least 20 - NICE (sched(7)); without it an idle child could never catch up."""
    import resource

    try:
        with open("/proc/self/status") as fh:
            caps = next(int(line.split()[1], 16) for line in fh if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        caps = 0
    if caps & (1 << CAP_SYS_NICE):
        return True
    return resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - NICE


class TraceWriterProcess:
    """`write(rows) -> skipped ids`, executed by `mlops.requestlog.write_requests` in a child process."""

    def __init__(self, url: str | None, timeout_s: float = 120.0, *, idle: bool = True) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._proc: subprocess.Popen | None = None
        self._send = self._recv = None
        # SCHED_IDLE: the child runs only on CPU time nothing else wants, so a burst of traffic costs the gateway
        # nothing (measured: nice 10 alone still took 8% of c=1 throughput on 2 cores). Only where the child can be
        # brought back to nice 10 when its backlog grows (`pace`), else it would starve for as long as the box is busy.
        self.idle_allowed = idle and hasattr(os, "SCHED_IDLE") and can_leave_idle()
        self._idle = False

    def write(self, rows: list, idle_for: float = 0.0) -> list[str]:
        """The skipped ids of `rows`. The batch may wait `idle_for` seconds for idle CPU time, then it competes."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            self.pace(urgent=idle_for <= 0)
            self._send.send(rows)
            if self._idle and not self._recv.poll(idle_for):
                self.pace(urgent=True)  # a starved child: the machine stayed busy for the whole lag
            if not self._recv.poll(self.timeout_s):
                raise TimeoutError(f"the trace writer process did not answer within {self.timeout_s:g} s")
            ok, value = self._recv.recv()
        except (OSError, EOFError, TimeoutError):
            self.close(0)  # replaced on the next batch
            raise
        if not ok:
            raise RuntimeError(value)
        return value

    def _start(self) -> None:
        from multiprocessing.connection import Connection

        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        code = "import sys, serving.trace_writer as w; w.child_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])"
        self._idle = False
        self._proc = subprocess.Popen([sys.executable, "-c", code, str(to_child_r), str(from_child_w), self.url or ""],
                                      pass_fds=(to_child_r, from_child_w), cwd=os.getcwd(),
                                      env={**os.environ, "PYTHONPATH": _import_path()})
        os.close(to_child_r)
        os.close(from_child_w)
        self._send, self._recv = Connection(to_child_w, readable=False), Connection(from_child_r, writable=False)

    def pace(self, urgent: bool) -> None:
        """Idle priority while the backlog is young, nice 10 once it is not (`urgent`)."""
        proc = self._proc
        want_idle = self.idle_allowed and not urgent
        if proc is None or proc.poll() is not None or want_idle == self._idle:
            return
        policy = os.SCHED_IDLE if want_idle else os.SCHED_OTHER
        try:
            os.sched_setscheduler(proc.pid, policy, os.sched_param(0))
        except (PermissionError, ProcessLookupError, OSError):
            self.idle_allowed = False
            return
        self._idle = want_idle

    def hurry(self) -> bool:
        """Back to the gateway's priority (it is draining: no latency is left to protect), so a batch in hand on a
        busy machine lands before the drain ends. False where the OS refuses (raising priority needs
        CAP_SYS_NICE): the batch then finishes at its own pace."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return False
        try:
            if self._idle:
                os.sched_setscheduler(proc.pid, os.SCHED_OTHER, os.sched_param(0))
                self._idle = False
            os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0))
        except (PermissionError, ProcessLookupError, OSError):
            return False
        return True

    def close(self, timeout: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            self._send.send(None)  # finish the batch in hand, then exit
            proc.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            for conn in (self._send, self._recv):
                conn.close()


def _import_path() -> str:
    """The parent's import roots first, so the child imports the same code (the repository, not an install)."""
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    return os.pathsep.join(dict.fromkeys([*roots, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]))


def child_main(read_fd: int, write_fd: int, url: str) -> None:
    """The child: batches in, (True, skipped ids) or (False, error) out, until None or the parent goes."""
    from multiprocessing.connection import Connection

    os.nice(NICE)
    from mlops.requestlog import write_requests

    recv, send = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    while True:
        try:
            rows = recv.recv()
        except (EOFError, OSError):
            return
        if rows is None:
            return
        try:
            send.send((True, write_requests(rows, url or None)))
        except Exception as err:  # noqa: BLE001 - reported to the parent, which counts the batch as lost
            send.send((False, f"{type(err).__name__}: {str(err)[:500]}"))
