"""Where studies live. Embedded default: SQLite at `.mlops/optuna.db`; `postgresql://...` lets any number of
workers on any number of machines share one study. Running trials send heartbeats, so a worker killed with
SIGKILL leaves a trial that the next worker (or `mlops sweep status`) marks FAIL, never one stuck RUNNING."""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from mlops.errors import MLOpsError

STORAGE_ENV = "MLOPS_SWEEP_STORAGE"
FIX = (f"Fix: start the database or pass a reachable --storage (or set {STORAGE_ENV}); leave both unset for "
       "the embedded SQLite study under .mlops/.")

log = logging.getLogger(__name__)


class StorageError(MLOpsError):
    """The study storage cannot be reached or used."""


def default_url() -> str:
    from mlops.paths import mlops_dir

    return f"sqlite:///{mlops_dir() / 'optuna.db'}"


def normalize_url(url: str) -> str:
    """URLs as users type them: `postgresql://` and `postgres://` get the installed driver (psycopg 3);
    a bare file path is an SQLite file."""
    url = url.strip()
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def resolve_url(explicit: str | None = None, configured: str | None = None) -> str:
    """--storage, then sweep.storage, then $MLOPS_SWEEP_STORAGE, then the embedded SQLite default."""
    chosen = explicit or configured or os.environ.get(STORAGE_ENV, "").strip() or default_url()
    return normalize_url(chosen)


def display_url(url: str) -> str:
    from mlops.tracking import display_uri

    return display_uri(url)


def check_reachable(url: str, timeout: float = 5.0) -> None:
    """Fail before any trial when the storage cannot be used."""
    scheme = url.split("://", 1)[0]
    if scheme == "sqlite":
        path = Path(url.removeprefix("sqlite:///"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StorageError(f"study storage folder {path.parent} cannot be created ({err}). {FIX}") from None
        if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise StorageError(f"study storage {path} is not writable. {FIX}")
        return
    if not scheme.startswith(("postgresql", "mysql")):
        raise StorageError(f"study storage '{display_url(url)}' has an unsupported scheme '{scheme}'. "
                           "Use postgresql://user@host:port/db or sqlite:///path/to/file.db. " + FIX)
    import sqlalchemy

    connect_args = {"connect_timeout": int(max(1, timeout))}
    try:
        engine = sqlalchemy.create_engine(url, connect_args=connect_args, poolclass=sqlalchemy.pool.NullPool)
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
    except Exception as err:  # noqa: BLE001 - driver errors differ; all mean "cannot use it"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StorageError(f"study storage {display_url(url)} is unreachable ({first}). {FIX}") from None


def engine_kwargs(url: str) -> dict:
    if url.startswith("sqlite"):
        # Several local workers share one file: wait for the lock instead of failing at once.
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}


def open_storage(url: str, *, heartbeat_interval: int | None = None, grace_period: int | None = None,
                 on_stale: Callable | None = None):
    """An RDBStorage; with a heartbeat interval, trials whose worker stopped beating are failed after the grace
    period (default 3 intervals) and `on_stale(study, frozen_trial)` runs for each."""
    import optuna

    kwargs = {}
    if heartbeat_interval:
        kwargs = {"heartbeat_interval": heartbeat_interval,
                  "grace_period": grace_period or 3 * heartbeat_interval,
                  "heartbeat_stale_trial_callback": on_stale}
    for attempt in range(5):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url), **kwargs)
            except Exception as err:  # noqa: BLE001
                if _creation_race(err) and attempt < 4:
                    # Workers started together on an empty database all create Optuna's schema; the losers
                    # see "already exists" and find the winner's tables on the next try.
                    time.sleep(0.5 * (attempt + 1))
                    continue
                raise StorageError(f"cannot open study storage {display_url(url)}: {err}. {FIX}") from None
    raise AssertionError("unreachable")


def _creation_race(err: BaseException) -> bool:
    """Another worker created the same schema object first (classified by exception type, through the chain)."""
    import sqlite3

    import sqlalchemy.exc

    race_types: tuple[type, ...] = (sqlalchemy.exc.IntegrityError,)
    try:
        import psycopg.errors

        race_types += (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable, psycopg.errors.DuplicateObject)
    except ImportError:
        pass
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, race_types):
            return True
        # SQLite reports a lost CREATE race only as an OperationalError; its text is the one signal it gives.
        if isinstance(seen, sqlite3.OperationalError) and "already exists" in str(seen):
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__
    return False


def study_names(storage) -> list[str]:
    return sorted(s.study_name for s in storage.get_all_studies())


def fail_stale(study) -> None:
    """Fail trials whose worker stopped sending heartbeats (and run the stale callback for each)."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class Heartbeat:
    """Records a trial's heartbeat every interval on a daemon thread while the trial runs."""

    def __init__(self, storage, trial_id: int, interval: int | None) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self.interval:
            self.storage.record_heartbeat(self.trial_id)
            self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{self.trial_id}", daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        missed = 0
        while not self._stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
                if missed:
                    log.warning("trial %s: heartbeat recorded again after %d missed beat(s)", self.trial_id, missed)
                missed = 0
            except Exception as err:  # noqa: BLE001 - retried next interval; a lasting outage fails the trial
                missed += 1
                log.warning("trial %s: heartbeat %d missed (%s: %s); the trial is failed as stale if this lasts "
                            "past the grace period", self.trial_id, missed, type(err).__name__, err)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
