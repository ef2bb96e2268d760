"""Layer 3 (the one door: lock, verify, plan, sign, append): every release act, checked and written here, in an order where the ledger decides.

Only this module moves an MLflow alias or writes a governed tag (a test walks every module's AST to hold it).
An act is serialized (a lock file beside a SQLite store; a PostgreSQL advisory lock otherwise), then, in one
ledger transaction: the whole chain is verified (a chain that does not verify stops every act, naming the first
bad entry), the model's state is replayed, the caller's `plan_for(state)` decides or refuses, and the entries
are appended and committed. Only then are MLflow's aliases and stage tags, display copies of the ledger's word,
written. So a fault before the commit changes nothing, and a fault after it leaves an act that is in force
(every consumer resolves releases from the ledger) with a display copy that lags: the act says so in one
paragraph (exit 2), and the next act, or the same command run again, rewrites the copy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlops.errors import MLOpsError
from mlops.files import exclusive_lock
from registry.rules import RefusedError

log = logging.getLogger(__name__)


class ConcurrentChangeError(RefusedError):
    """The alias moved since the caller read it; nothing was changed."""


@dataclass
class Plan:
    """What a transition writes: ledger entries, then alias moves (alias -> (before, after)), then display tags."""

    entries: list[dict] = field(default_factory=list)
    aliases: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    version_tags: dict[str, dict[str, str]] = field(default_factory=dict)


def _sqlite_lock_path(url: str) -> Path:
    path = Path(url.split("///", 1)[-1])
    return path.with_name(path.name + ".registry.lock")


def registry_aliases(model: str) -> dict[str, str]:
    """The aliases MLflow holds now (a model not yet in MLflow has none), once this process's pending display
    copies have landed."""
    from mlops.tracking import registered_aliases

    flush_display()
    return registered_aliases(model)


def alias_drift(state, actual: dict[str, str] | None = None) -> list[str]:
    """The governed aliases MLflow shows differently from the ledger (`actual`: MLflow's aliases, read now when
    not given)."""
    from registry.state import ALIAS_OF_STAGE

    actual = registry_aliases(state.model) if actual is None else actual
    return [f"@{alias} points to {actual.get(alias) or 'nothing'} in MLflow but the ledger says "
            f"{state.aliases.get(alias) or 'nothing'}"
            for alias in sorted(ALIAS_OF_STAGE.values()) if actual.get(alias) != state.aliases.get(alias)]


def _move_aliases(model: str, moves: dict[str, tuple[str | None, str | None]], *, undo: bool = False,
                  store: str | None = None) -> None:
    from mlops.tracking import call, client

    # The registry client itself: MlflowClient's wrappers first read the whole registered model to refuse prompts,
    # a second round trip per alias for a model the registry registered itself. Deleting an alias MLflow does not
    # hold is a no-op there.
    c = client(store)._get_registry_client()
    for alias, (before, after) in moves.items():
        target = before if undo else after
        if target is None:
            call(f"alias @{alias}", c.delete_registered_model_alias, model, alias)
        else:
            call(f"alias @{alias}", c.set_registered_model_alias, model, alias, target)


def _check_display_copy(state, model: str, plan: Plan, actual: dict[str, str] | None = None) -> None:
    """Refuse to move an alias that was moved behind the registry's back: the ledger's word must hold first.
    `actual`: MLflow's aliases read under this act's lock (read now when not given)."""
    drifted = alias_drift(state, actual)  # the one comparison of MLflow's aliases with the ledger's
    if drifted:
        raise RefusedError(f"{drifted[0]}: it was moved outside the registry. Nothing was changed. Fix: run "
                           f"`mlops registry verify {model}`, then `mlops registry reconcile {model}` (admin).")


class DisplayLagError(MLOpsError):
    """The act is in the ledger and in force, but a display copy in MLflow could not be written."""


STAGE_TAG = "registry.stage"  # the display copy of a version's stage
PG_LOCK_KEY = 0x6D6C6F7073  # "mlops": one advisory lock serializes registry acts on a PostgreSQL store


@contextlib.contextmanager
def _act_lock(eng, db: str):
    """Acts one at a time, from the ledger commit through the display writes, so copies land in ledger order."""
    if eng.dialect.name == "sqlite":
        with exclusive_lock(_sqlite_lock_path(db)):
            yield
        return
    from registry.ledger import db_errors, lock_engine

    with db_errors(db, "lock"):
        conn = lock_engine(db).connect()
        wait = int(float(os.environ.get("MLOPS_REGISTRY_LOCK_TIMEOUT", "120")) * 1000)
        conn.exec_driver_sql(f"SET lock_timeout = {wait}")
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({PG_LOCK_KEY})")
        conn.commit()
    try:
        yield
    finally:
        try:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({PG_LOCK_KEY})")
            conn.commit()
        except Exception:  # noqa: BLE001 - a lost connection has released its session lock already
            conn.invalidate()
        conn.close()


def run(model: str, plan_for: Callable, *, actor, url: str | None = None, repairing: bool = False,
        prepare: Callable | None = None) -> list:
    """Serialize, verify, replay the model's state, let `plan_for(state)` decide (or raise a refusal), sign each
    entry with `actor`'s key and append it once the rules every verifier replays accept it (`ledger.append`),
    commit, then write the display copies. Returns the appended ledger entries (none: nothing to do).

    The act is in force when its entries commit: that is when this returns. MLflow's display copies (aliases,
    then stage tags) are written next by a writer thread that still holds the act lock, so no other act starts
    before they land and copies land in ledger order; `flush_display(report=True)` waits for them and raises
    `DisplayLagError` if they could not be written (the CLI and the app do, before they answer).

    `prepare(state)` runs under the act lock before the ledger transaction: the place for an MLflow write the
    entries will name (a new model version), so concurrent acts never race inside MLflow."""
    from registry import ledger
    from registry.entries import GOVERNANCE
    from registry.resolve import state_in

    if getattr(actor, "signer", None) is None:
        from mlops.identities import AuthError

        raise AuthError(f"'{getattr(actor, 'name', actor)}' acts without their key: every act is signed by the "
                        "person who does it. Fix: sign in with MLOPS_USER and MLOPS_PASSWORD (the passphrase of "
                        "your key file). Nothing was changed.")
    flush_display()  # the previous act's display copies land first, in order
    db = ledger.ledger_url(url)
    eng = ledger.engine(db)
    governed = model != GOVERNANCE
    held = contextlib.ExitStack()
    held.enter_context(_act_lock(eng, db))
    try:
        known = ledger.verified(db)
        shown = None
        if governed:  # outside the ledger transaction: on SQLite, MLflow's writes need the file's write lock
            shown = _heal_display(model, state_in(model, known.entries), known.entries)
            if prepare is not None:
                prepare(state_in(model, known.entries))
        with ledger.locked(db, known=known) as chain:
            state = state_in(model, chain.entries)
            if governed:
                _refuse_policy_conflict(state)
            plan = plan_for(state)
            if governed and not repairing:
                _check_display_copy(state, model, plan, shown)
            written = [ledger.append(chain, actor.signer, **values) for values in plan.entries]
    except BaseException:
        held.close()
        raise
    _write_display_later(model, plan, written, held)
    return written


def _refuse_policy_conflict(state) -> None:
    from registry.config import policy_file_conflict

    problem = policy_file_conflict(state.policy)
    if problem:
        raise RefusedError(problem)


def _write_aliases(model: str, plan: Plan, written: list, store: str | None = None) -> None:
    if not plan.aliases:
        return
    last = None
    for _attempt in range(2):
        try:
            _move_aliases(model, plan.aliases, store=store)
            return
        except MLOpsError as err:
            last = err
    seqs = ", ".join(f"#{e.seq}" for e in written)
    raise DisplayLagError(
        f"the act is recorded in the ledger (entry {seqs}) and is in force: serving and every consumer resolve "
        f"releases from the ledger. MLflow's display alias of '{model}' could not be written ({last}). Fix: none "
        f"is needed for serving; run the same command again, or any registry act on '{model}', once the store "
        "answers, and the copy is rewritten (`mlops registry status` shows it until then)."
    ) from None


def _last_moves(model: str, entries) -> dict[str, tuple[str | None, str | None]]:
    """Per governed alias, (before, after) of the newest ledger entry that moved it."""
    moves: dict[str, tuple[str | None, str | None]] = {}
    for e in entries:
        if e.model != model:
            continue
        if e.alias:
            moves[e.alias] = (e.alias_before, e.alias_after)
        for released in e.evidence.get("released_aliases") or ():
            moves[released] = (e.version, None)
    return moves


def _heal_display(model: str, state, entries) -> dict[str, str]:
    """Rewrite a display alias that still shows what the ledger's newest move replaced: an earlier act whose
    display write failed after its commit. Anything else that differs was moved by hand and is refused later.
    Returns MLflow's aliases as they are now."""
    from registry.state import ALIAS_OF_STAGE

    actual = registry_aliases(model)
    moves = _last_moves(model, entries)
    lagging = {}
    for alias in ALIAS_OF_STAGE.values():
        said, shown = state.aliases.get(alias), actual.get(alias)
        if shown != said and alias in moves and moves[alias][0] == shown:
            lagging[alias] = (shown, said)
    if lagging:
        log.warning("display aliases of %s lagged behind the ledger; rewriting %s", model, sorted(lagging))
        _move_aliases(model, lagging)
        # The act whose alias write failed wrote no stage tags either: rewrite them all, in the ledger's words.
        _write_display_tags(model, Plan(version_tags={v: {STAGE_TAG: vs.stage} for v, vs in state.versions.items()}))
        actual = {**{a: v for a, v in actual.items() if a not in lagging},
                  **{a: after for a, (_, after) in lagging.items() if after is not None}}
    return actual


_DISPLAY: list[threading.Thread] = []
_LOCAL = threading.local()


def unreported_lags() -> list[DisplayLagError]:
    """This thread's acts whose display copies could not be written, not yet reported. Thread-local, not keyed
    by thread ident: idents are reused, and a later thread (another app session's) must not be told of an
    earlier thread's lag as if it were its own act's."""
    lags = getattr(_LOCAL, "lags", None)
    if lags is None:
        lags = _LOCAL.lags = []
    return lags


def _write_display_later(model: str, plan: Plan, written: list, held: contextlib.ExitStack) -> None:
    """Write the act's display copies on a non-daemon thread (a CLI process waits for it at exit) that releases
    the act lock once they are written."""
    if not plan.aliases and not plan.version_tags:
        held.close()
        return
    from mlops.tracking import tracking_uri

    lags, store = unreported_lags(), tracking_uri()  # the acting thread's; the act's store, whatever comes next

    def write() -> None:
        try:
            _write_aliases(model, plan, written, store)
            _write_display_tags(model, plan, store)
        except DisplayLagError as err:
            log.warning("%s", err)
            lags.append(err)
        finally:
            held.close()

    thread = threading.Thread(target=write, name=f"display-{model}")
    thread.start()  # started before it is listed: another thread's flush may join it at once
    _DISPLAY.append(thread)


def flush_display(*, report: bool = False) -> None:
    """Wait for this process's pending display copies. `report`: raise the `DisplayLagError` of any act of this
    thread whose copies could not be written since its last report (an act in force whose MLflow copy lags)."""
    while True:
        try:
            thread = _DISPLAY.pop(0)
        except IndexError:  # empty, or another thread took the last one (it waits for it)
            break
        thread.join()
    if report:
        lags = unreported_lags()
        if lags:
            err = lags[-1]
            lags.clear()
            raise err


def _write_display_tags(model: str, plan: Plan, store: str | None = None) -> None:
    """Stage tags are display copies: a failure here is reported by verify and repaired by reconcile."""
    from mlops.tracking import call, client

    c = client(store)
    for version, tags in plan.version_tags.items():
        for key, value in tags.items():
            try:
                call(f"version {model}/{version}", c.set_model_version_tag, model, version, key, value)
            except MLOpsError as err:
                log.warning("display tag %s on %s/%s not written (%s); `mlops registry reconcile` repairs it",
                            key, model, version, err)
