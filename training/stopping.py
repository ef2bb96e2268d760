"""How a training job stops: as a whole, and on a notice when it gets one.

* A preemption notice (SIGTERM, or a first Ctrl-C) only sets a flag. Every rank finishes the step it is in; the
  ranks agree on the flag inside the step's own all-reduce, save a checkpoint when the grace period leaves room
  for one, close the run KILLED with the reason, and leave through `Preempted`.
* A launcher that dies takes its workers with it: the launcher's children get a parent-death signal (Linux
  prctl), and every worker also watches the launcher's pid, so no rank trains on alone into a folder that a
  rerun is about to use.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time

from mlops.errors import MLOpsError
from mlops.files import pid_alive

log = logging.getLogger(__name__)
LAUNCHER_PID_ENV = "MLOPS_TRAIN_LAUNCHER_PID"
LAUNCHER_HOST_ENV = "MLOPS_TRAIN_LAUNCHER_HOST"
PR_SET_PDEATHSIG = 1
NOTICES = (signal.SIGTERM, signal.SIGINT)


class Preempted(MLOpsError):
    """The run stopped on a SIGTERM/SIGINT notice; it is KILLED with the reason and resumes on a rerun."""

    exit_code = 128 + int(signal.SIGTERM)

    def __init__(self, message: str, signum: int = int(signal.SIGTERM)) -> None:
        super().__init__(message)
        self.exit_code = 128 + int(signum)


class StopRequest:
    """The first stop notice this process received (signal and monotonic time), if any."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at: float | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "none"

    def request(self, signum: int) -> None:
        if self.signum is None:
            self.signum, self.at = int(signum), time.monotonic()

    def elapsed(self) -> float:
        return 0.0 if self.at is None else time.monotonic() - self.at

    def clear(self) -> None:
        self.signum = self.at = None


STOP = StopRequest()


@contextlib.contextmanager
def graceful_signals(*, escalate: bool = True, grace: float | None = None):
    """While inside, SIGTERM and SIGINT request a graceful stop. With `escalate` (a process a person may be
    typing at), a second SIGINT raises KeyboardInterrupt at once; workers leave it off, since a launcher and
    torchrun may both forward the same notice. Outside the main thread this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield STOP
        return
    previous = {sig: signal.getsignal(sig) for sig in NOTICES}

    def handler(signum, frame):
        if escalate and signum == signal.SIGINT and STOP.requested:
            raise KeyboardInterrupt
        first = not STOP.requested
        STOP.request(signum)
        if first:
            within = f" within the {grace:g} s grace period" if grace is not None else ""
            print(f"received {signal.Signals(signum).name}: finishing the current step, then saving a checkpoint"
                  f"{within}{' (Ctrl-C again to stop at once)' if escalate else ''}", file=sys.stderr, flush=True)

    for sig in NOTICES:
        signal.signal(sig, handler)
    try:
        yield STOP
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        STOP.clear()


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def child_dies_with_parent() -> None:
    """`preexec_fn` for a launcher's child (torchrun, deepspeed): it goes when the launcher goes."""
    die_with_parent(signal.SIGKILL)


def launcher_env() -> dict[str, str]:
    """What a launcher exports so that its workers can watch it."""
    return {LAUNCHER_PID_ENV: str(os.getpid()), LAUNCHER_HOST_ENV: socket.gethostname()}


class Watchdog:
    """Kills this worker (SIGKILL) when its launcher or its parent process is gone.

    The parent-death signal covers torchrun dying; the launcher pid covers the deepspeed launcher chain and a
    parent that died before the signal was armed. Only a launcher on this host can be watched by pid; workers
    on other nodes notice through the process group instead (their collectives fail when rank 0 goes)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        pid = os.environ.get(LAUNCHER_PID_ENV, "")
        same_host = os.environ.get(LAUNCHER_HOST_ENV) == socket.gethostname()
        self.launcher = int(pid) if pid.isdigit() and same_host else None
        self.parent = os.getppid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lost(self) -> str | None:
        if self.launcher is not None and not pid_alive(self.launcher):
            return f"launcher pid {self.launcher} is gone"
        if os.getppid() != self.parent:
            return f"parent pid {self.parent} is gone"
        return None

    def start(self) -> Watchdog:
        die_with_parent(signal.SIGKILL)
        if self.lost():  # the parent died before the parent-death signal was armed
            self._kill()
        self._thread = threading.Thread(target=self._watch, name="launcher-watchdog", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            if self.lost():
                self._kill()

    def _kill(self) -> None:
        print(f"worker {os.getpid()}: {self.lost()}; stopping with the rest of the job", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def stop(self) -> None:
        self._stop.set()


# --------------------------------------------------------------------------- the stop itself


def save_estimate(run) -> float:
    """Seconds a checkpoint takes until its manifest is on disk: the last one measured, else its size at a
    pessimistic 100 MB/s (written, then read back for the hashes)."""
    measured = max(run.saver.last_total_s, run.saver.last_save_s)
    if measured:
        return measured
    plan, t = run.plan, run.t
    params = plan["params_trainable"] if t.mode in ("lora", "qlora") else plan["params_total"]
    size = 4 * params + 4 * plan["params_trainable"] * (2 if t.zero_stage == 0 else 3)
    return 2 * size / 100e6


def stop_on_notice(run, *, step_ran: bool = True) -> None:
    """Every rank, after the step in which they agreed on a stop notice (or before the first step, when the
    notice came during setup): checkpoint if the grace period allows, close the run KILLED with the reason,
    raise Preempted."""
    from mlops.lineage import Tag
    from training.saver import any_rank

    t, grace = run.t, run.t.checkpoint.grace_seconds
    run.saver.wait()
    estimate = save_estimate(run)
    left = grace - STOP.elapsed()
    saved = None
    if step_ran and not any_rank(1.5 * estimate > left):
        run._save()
        run.saver.wait()
        saved = run.saver.dir / f"step-{run.step:08d}"
    notice = STOP.name if STOP.requested else "a stop notice to another rank"
    previous = run.prep.resume_from if run.saver.last_complete is None else run.saver.last_complete
    if saved is not None:
        what = f"checkpoint {saved.name} written {STOP.elapsed():.1f} s after the notice (grace {grace:g} s)"
        resume = f"it resumes from step {run.step}"
    elif not step_ran:
        what = "the notice came before the first step, nothing to save"
        resume = f"it resumes from {previous.name}" if previous else "it starts over"
    else:
        what = (f"no checkpoint: a save takes about {estimate:.1f} s and {max(left, 0):.1f} s of the {grace:g} s "
                "grace period (train.checkpoint.grace_seconds) were left")
        resume = f"it resumes from {previous.name}" if previous else "it starts over"
    reason = f"stopped by {notice} after step {run.step} of {t.max_steps}: {what}"
    if run.rank0:
        if run.trace is not None:
            run.trace.flush()
        run.tracker.set_tags({Tag.STOP_REASON: reason})
        run.tracker.close("KILLED", reason=reason)
    raise Preempted(f"training {reason}. Run {run.tracker.run_id} is KILLED. To continue: rerun the same command; "
                    f"{resume}.", STOP.signum or int(signal.SIGTERM))
