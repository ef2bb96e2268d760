"""The data-review page's reads and writes: a snapshot's drawn sample and stored verdicts, a new draw, and the
verdicts a person gave on the page, stored through `mlops.data.review.store`, the function `mlops data review
--verdicts` calls. Every rule about a draw or a verdict (ok, or bad with a reason; only drawn samples; the right
snapshot) lives there; this module only carries the page's choices to it.

Snapshots are read from this project's snapshot store (`.mlops/snapshots`), the folder the review lives beside.
"""

from __future__ import annotations

import json
from pathlib import Path

APP_FILE = "app-verdicts.jsonl"  # the page's verdicts as the JSONL `mlops data review --verdicts` reads


def may_review(identity):
    """Judging data changes what training may use: every role but the read-only viewer."""
    from registry.permissions import Permission

    if identity.can("train") or identity.can("spot_check"):
        return Permission(True)
    return Permission(False, f"{identity.name} has the role '{identity.role}', which reads and changes nothing; "
                             "judging a snapshot's sample needs trainer, approver or admin.")


def snapshots() -> list[dict]:
    from mlops.data.snapshot import list_snapshots

    return list_snapshots()


def folder_of(snapshot_id: str) -> Path:
    from mlops.data.snapshot import resolve_snapshot

    return resolve_snapshot(snapshot_id)


def local_acceptance(snapshot_id: str) -> dict | None:
    """The acceptance report in the manifest of the snapshot as this store holds it."""
    from mlops.data.format import read_manifest

    return (read_manifest(folder_of(snapshot_id)) or {}).get("acceptance")


def current_draw(folder: Path) -> tuple[dict | None, list[dict] | None]:
    """(the latest draw, its items): the items are those of the sample file beside the snapshot when it holds
    exactly the drawn samples; None when the draw was written elsewhere (`--out`) or replaced."""
    from mlops.data.review import review_dir

    where = review_dir(folder)
    try:
        drawn = json.loads((where / "draw.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    try:
        items = [json.loads(line) for line in (where / "sample.jsonl").read_text(encoding="utf-8").splitlines()
                 if line.strip()]
    except (OSError, ValueError):
        return drawn, None
    return drawn, items if [i.get("sample_id") for i in items] == drawn["sample_ids"] else None


def prior_verdicts(folder: Path) -> dict[str, dict]:
    from mlops.data.review import review_status

    status = review_status(folder) or {}
    return {str(v["sample_id"]): v for v in status.get("verdicts", [])}


def _draw(actor, snapshot_id: str, n: int, seed: int):
    from mlops.data.review import draw

    _require(actor)
    _, items = draw(folder_of(snapshot_id), int(n), int(seed))
    return items


def _store(actor, snapshot_id: str, rows: list[dict]) -> dict:
    from mlops.data.review import review_dir, store
    from mlops.files import atomic_write_text

    _require(actor)
    folder = folder_of(snapshot_id)
    path = review_dir(folder) / APP_FILE
    atomic_write_text(path, "".join(json.dumps({"snapshot_id": folder.name, **row}, ensure_ascii=False) + "\n"
                                    for row in rows))
    return store(folder, path, reviewer=actor.name)


def _require(actor) -> None:
    """Checked again when the act runs (the role may have changed since the page was drawn)."""
    from mlops.identities import AuthError

    permission = may_review(actor)
    if not permission:
        raise AuthError(permission.reason)


def draw_sample(snapshot_id: str, n_key: str, seed_key: str) -> None:
    """Button callback: draw a new sample (it replaces the earlier draw; verdicts of the old one stop counting)."""
    import streamlit as st

    from app import actions, ui

    done = actions.attempt(f"Draw a sample of {snapshot_id}", _draw, snapshot_id,
                           st.session_state.get(n_key) or 200, st.session_state.get(seed_key) or 0)
    if done is not None:
        actor, items = done
        ui.flash("success", f"Drew {len(items)} samples of {snapshot_id} as {actor.name}. Judge each one below.")


def save_verdicts(snapshot_id: str, sample_ids: list[str], prefix: str) -> None:
    """Form callback: every sample with a chosen verdict, stored through the CLI's own function; samples left
    without a choice stay unjudged (the review is then incomplete, and says how many are missing)."""
    import streamlit as st

    from app import actions, ui

    rows = []
    for i, sample_id in enumerate(sample_ids):
        verdict = st.session_state.get(f"{prefix}-verdict-{i}")
        if verdict:
            rows.append({"sample_id": sample_id, "verdict": verdict,
                         "reason": (st.session_state.get(f"{prefix}-reason-{i}") or "").strip()})
    if not rows:
        ui.flash("error", "Data review: no verdict was chosen. Nothing was stored.")
        return
    done = actions.attempt(f"Data review of {snapshot_id}", _store, snapshot_id, rows)
    if done is not None:
        actor, s = done
        state = "complete" if s["complete"] else f"incomplete: {s['missing']} without a verdict"
        ui.flash("success", f"Data review of {snapshot_id}: {s['judged']}/{s['drawn']} judged as {actor.name} "
                            f"({state}); {s['ok']} ok, {s['bad']} bad.")

