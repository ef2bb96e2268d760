"""Compare-and-set: check, ledger and move aliases as one serialized act, or change nothing.

PostgreSQL: one transaction holds the ledger head row `FOR UPDATE`, re-reads the state, checks the caller's
expectation, appends the entries, moves the MLflow alias (MLflow's own connection, other rows) and commits.
A failure before the commit rolls the ledger back and restores the alias.

SQLite: the MLflow store and the ledger share one file, and SQLite has one writer, so a ledger transaction held
open would block MLflow's own alias write. A lock file beside the database serializes registry writers instead:
under it the state is read, checked, the alias moved, and the entries appended in one short `BEGIN IMMEDIATE`.

Either way a crash between the alias move and the ledger commit leaves an alias the ledger does not explain:
`mlops registry verify` reports it and `mlops registry reconcile` moves it back (ledgered).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlops.errors import MLOpsError

log = logging.getLogger(__name__)


class RefusedError(MLOpsError):
    """A transition the rules refuse; nothing was changed."""


class ConcurrentChangeError(RefusedError):
    """The alias moved since the caller read it; nothing was changed."""


@dataclass
class Plan:
    """What a transition writes: ledger entries, then alias moves (alias -> (before, after)), then display tags."""

    entries: list[dict] = field(default_factory=list)
    aliases: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    version_tags: dict[str, dict[str, str]] = field(default_factory=dict)


def _sqlite_lock_path(url: str) -> Path | None:
    if not url.startswith("sqlite"):
        return None
    path = Path(url.split("///", 1)[-1])
    return path.with_name(path.name + ".registry.lock")


@contextlib.contextmanager
def _file_lock(path: Path | None):
    if path is None:
        yield
        return
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def registry_aliases(model: str) -> dict[str, str]:
    """The aliases MLflow holds now (a model not yet in MLflow has none)."""
    from mlops.model_refs import client, is_missing, unavailable

    try:
        found = client().get_registered_model(model)
    except Exception as err:
        if is_missing(err):
            return {}
        raise unavailable(err, f"registered model '{model}'") from err
    return {a: str(v) for a, v in (found.aliases or {}).items()}


def _move_aliases(model: str, moves: dict[str, tuple[str | None, str | None]], *, undo: bool = False) -> None:
    from mlops.model_refs import call, client

    c = client()
    for alias, (before, after) in moves.items():
        target = before if undo else after
        if target is None:
            call(f"alias @{alias}", c.delete_registered_model_alias, model, alias)
        else:
            call(f"alias @{alias}", c.set_registered_model_alias, model, alias, target)


def _check_display_copy(state, model: str, plan: Plan) -> None:
    """Refuse to move an alias that was moved behind the registry's back: the ledger's word must hold first."""
    from registry.state import ALIAS_OF_STAGE

    actual = registry_aliases(model)
    for alias in sorted(set(ALIAS_OF_STAGE.values()) | set(plan.aliases)):  # any governed alias, not just this one
        said = state.aliases.get(alias)
        if actual.get(alias) != said:
            raise RefusedError(
                f"MLflow's @{alias} of '{model}' points to {actual.get(alias) or 'nothing'}, but the ledger says "
                f"{said or 'nothing'}: it was moved outside the registry. Nothing was changed. Fix: run "
                f"`mlops registry verify {model}`, then `mlops registry reconcile {model}` (admin)."
            )


def run(model: str, plan_for: Callable, *, url: str | None = None, repairing: bool = False) -> list:
    """Serialize, replay the model's state, let `plan_for(state)` decide (or raise a refusal), then write.

    Returns the appended ledger entries.
    """
    from registry import ledger
    from registry.state import replay

    flush_display()  # the previous act's display copies land first, in order
    db = ledger.ledger_url(url)
    eng = ledger.engine(db)
    if eng.dialect.name == "sqlite":
        with _file_lock(_sqlite_lock_path(db)):
            state = replay(model, ledger.entries(model, db))
            plan = plan_for(state)
            if not repairing:
                _check_display_copy(state, model, plan)
            _move_aliases(model, plan.aliases)
            try:
                with ledger.locked(db) as (conn, seq, head):
                    written = _append_all(conn, seq, head, plan)
            except BaseException:
                _undo(model, plan)
                raise
    else:
        moved = False
        try:
            with ledger.locked(db) as (conn, seq, head):
                state = replay(model, _entries_in(conn, model))
                plan = plan_for(state)
                if not repairing:
                    _check_display_copy(state, model, plan)
                written = _append_all(conn, seq, head, plan)
                moved = True
                _move_aliases(model, plan.aliases)
        except BaseException:
            if moved:
                _undo(model, plan)
            raise
    _write_display_tags_later(model, plan)
    return written


def _entries_in(conn, model: str):
    import json

    import sqlalchemy as sa

    from registry.ledger import LEDGER, Entry

    rows = conn.execute(sa.select(LEDGER).where(LEDGER.c.model == model).order_by(LEDGER.c.seq)).mappings().all()
    return [Entry(**{**dict(r), "evidence": json.loads(r["evidence"]) if r["evidence"] else {}}) for r in rows]


def _append_all(conn, seq: int, head: str, plan: Plan) -> list:
    from registry.ledger import append

    written = []
    for values in plan.entries:
        entry = append(conn, seq, head, **values)
        seq, head = entry.seq, entry.hash
        written.append(entry)
    return written


def _undo(model: str, plan: Plan) -> None:
    try:
        _move_aliases(model, plan.aliases, undo=True)
    except Exception as err:  # noqa: BLE001 - the store is gone too: verify/reconcile repair it later
        log.error("could not restore aliases of %s after a failed transition (%s); run `mlops registry verify %s`",
                  model, err, model)


_DISPLAY: list[threading.Thread] = []


def _write_display_tags_later(model: str, plan: Plan) -> None:
    """Display copies are written off the act's critical path, on a non-daemon thread (so a CLI process waits
    for them at exit); the next act, `verify` and `flush_display()` wait for them first."""
    if not plan.version_tags:
        return
    thread = threading.Thread(target=_write_display_tags, args=(model, plan), name=f"display-tags-{model}")
    _DISPLAY.append(thread)
    thread.start()


def flush_display() -> None:
    while _DISPLAY:
        _DISPLAY.pop(0).join()


def _write_display_tags(model: str, plan: Plan) -> None:
    """Stage tags are display copies: a failure here is reported by verify and repaired by reconcile."""
    from mlops.model_refs import call, client

    c = client()
    for version, tags in plan.version_tags.items():
        for key, value in tags.items():
            try:
                call(f"version {model}/{version}", c.set_model_version_tag, model, version, key, value)
            except MLOpsError as err:
                log.warning("display tag %s on %s/%s not written (%s); `mlops registry reconcile` repairs it",
                            key, model, version, err)
