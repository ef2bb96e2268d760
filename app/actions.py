"""Button callbacks: call `registry.release` as the logged-in identity, say what happened, clear cached reads.

Callbacks receive, as arguments bound when the page was drawn, exactly what the user saw (the version, and for
promotions and rollbacks the alias target the page loaded, passed on as `expect_version`), so a change made by
someone else in between is refused by the registry's compare-and-set instead of being overwritten. Every rule
is checked again by the registry; a refusal or an outage becomes a plain message and nothing else happens.
"""

from __future__ import annotations

from mlops.errors import MLOpsError

RESULT_KEY = "mlops_last_result"


def _comment(key: str | None) -> str:
    import streamlit as st

    return (st.session_state.get(key) or "").strip() if key else ""


def attempt(what: str, action, *args, **kwargs):
    """(identity, what `action(identity, *args, **kwargs)` returned), or None once a refusal, an expired session
    or an outage has been flashed. Cached reads are cleared either way."""
    from app import data, ui
    from app.auth import current
    from app.config import settings
    from mlops.identities import AuthError
    from registry.transition import DisplayLagError, RefusedError, flush_display

    try:
        actor = current(settings().session_timeout_min)
        if actor is None:
            ui.flash("error", f"{what}: you are not logged in any more (the session expired). Nothing was changed.")
            return None
        done = action(actor, *args, **kwargs)
        flush_display(report=True)  # the page shows MLflow's copies too: they land before it is redrawn
        return actor, done
    except DisplayLagError as err:  # done and in force; only MLflow's copy lags
        ui.flash("error", f"{what}: {err}")
    except (RefusedError, AuthError) as err:
        ui.flash("error", f"{what} refused: {err}")
    except MLOpsError as err:  # an outage: the store, the ledger or the identities file cannot be used
        ui.flash("error", f"{what} could not be done: {err}")
    except Exception as err:  # noqa: BLE001 - the page must stay usable; the log keeps the traceback
        ui.log.exception("app: %s failed", what)
        ui.flash("error", f"{what} failed: {ui.plain(err)}")
    finally:
        try:  # an act that was in force before a later step failed: its lag is this session's to see, now
            flush_display(report=True)
        except DisplayLagError as err:
            ui.flash("error", f"{what}: {err}")
        data.invalidate()
    return None


def perform(what: str, action, *args, clear: tuple[str, ...] = (), **kwargs) -> None:
    """Run `action(identity, *args, **kwargs)`; flash its ledger entry or its refusal. After a success the
    widgets named in `clear` (comment, confirmation) are emptied for the next decision."""
    import streamlit as st

    from app import ui

    done = attempt(what, action, *args, **kwargs)
    if done is None:
        return
    actor, entry = done
    row = entry.as_dict()
    st.session_state[RESULT_KEY] = {"what": what, "entry": row}
    for key in clear:
        st.session_state[key] = False if key.endswith("confirm") else ""
    move = (f" @{row['alias']}: {row['alias_before'] or 'nothing'} → {row['alias_after'] or 'nothing'}."
            if row.get("alias") else "")
    ui.flash("success", f"{what}: done as {actor.name}. Ledger entry #{row['seq']} ({row['action']} "
                        f"{row['model']} v{row['version']}).{move}", entry=row)


def request(model: str, version: str, to_stage: str, comment_key: str) -> None:
    from registry.release import request as act

    perform(f"Request v{version} of {model} → {to_stage}", act, model, version, to_stage, _comment(comment_key),
            clear=(comment_key,))


def decide(model: str, version: str, approve: bool, comment_key: str) -> None:
    from registry.release import decide as act

    verb = "Approve" if approve else "Reject"
    perform(f"{verb} v{version} of {model}", act, model, version, _comment(comment_key), approve=approve,
            clear=(comment_key,))


def override(model: str, version: str, gate: str, reason_key: str) -> None:
    from registry.release import override as act

    perform(f"Override the {gate} gate of v{version} of {model}", act, model, version, gate, _comment(reason_key),
            clear=(reason_key,))


def promote(model: str, version: str, to_stage: str, expect_version: str | None, confirm_key: str) -> None:
    from registry.release import promote as act

    perform(f"Promote v{version} of {model} to {to_stage}", act, model, version, to_stage,
            expect_version=expect_version or "none", clear=(confirm_key,))


def rollback(model: str, to_version: str | None, expect_version: str | None, reason_key: str,
             confirm_key: str) -> None:
    from registry.release import rollback as act

    perform(f"Roll back {model}", act, model, _comment(reason_key), to_version=to_version,
            expect_version=expect_version or "none", clear=(reason_key, confirm_key))


def spot_check(check_id: str, items: list[int], prefix: str) -> None:
    """Record the verdicts given on the page (items left without a choice are skipped, not cleared)."""
    import streamlit as st

    from app import ui
    from registry.spotcheck import record_many

    verdicts = [{"item": n, "preferred": st.session_state.get(f"{prefix}-pref-{n}"),
                 "wrong_fact": "".join(st.session_state.get(f"{prefix}-wrong-{n}") or []),
                 "note": st.session_state.get(f"{prefix}-note-{n}") or ""} for n in items]
    verdicts = [v for v in verdicts if v["preferred"]]
    if not verdicts:
        ui.flash("error", "Spot-check: no verdict was chosen. Nothing was recorded.")
        return
    done = attempt(f"Spot-check {check_id}", record_many, check_id, verdicts)
    if done is not None:
        actor, summary = done
        tallies = summary["tallies"]
        state = "complete: the review is in the ledger" if summary["complete"] else "not complete yet"
        ui.flash("success", f"Spot-check {check_id}: {len(verdicts)} verdict(s) recorded as {actor.name}; "
                            f"{summary['reviewed']} of {summary['items']} items reviewed ({state}); "
                            f"same or better {tallies['share_same_or_better']:.0%}, wrong facts "
                            f"{tallies['wrong_fact']}.")
