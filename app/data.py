"""Every registry read the app makes, cached per store for `app.cache_ttl_s` and cleared by every action.

Each query takes `store` (tracking URI + ledger URL) as its first argument, so two stores never share a cached
answer. Answers are plain data (dicts, lists, dataclasses) because Streamlit's cache hands out pickled copies.
Nothing here decides anything: rules are asked of `registry.permissions` and `registry.gates`.
"""

from __future__ import annotations

import functools
import json

from mlops.errors import NotFoundError
from mlops.lineage import Tag


def _cached(fn):
    """`st.cache_data` applied at first call, so importing this module does not import Streamlit."""
    holder: dict = {}

    @functools.wraps(fn)
    def wrapper(*args):
        if "cached" not in holder:
            import streamlit as st

            from app.config import settings

            holder["cached"] = st.cache_data(ttl=settings().cache_ttl_s or None, show_spinner=False)(fn)
        return holder["cached"](*args)

    return wrapper


def invalidate() -> None:
    import streamlit as st

    st.cache_data.clear()


def store() -> str:
    """The cache key of the store this process reads: tracking URI and ledger database."""
    from mlops.tracking import tracking_uri
    from registry.ledger import ledger_url

    return f"{tracking_uri()}|{ledger_url()}"


# --------------------------------------------------------------------------- the ledger and states


@_cached
def ledger_rows(store: str) -> list[dict]:
    from registry import ledger

    return [e.as_dict() for e in ledger.entries()]


def entries(store: str, model: str | None = None) -> list:
    from registry.entries import Entry

    return [Entry(**row) for row in ledger_rows(store) if model is None or row["model"] == model]


@_cached
def model_state(store: str, model: str):
    """The model's state from the verified ledger (LedgerBroken, shown by the page, when it does not verify)."""
    from registry.resolve import verified_state

    return verified_state(model)


@_cached
def registered_models(store: str) -> dict[str, dict]:
    """Every model MLflow's registry holds (governed by the ledger or not): name -> aliases, versions."""
    from mlops.tracking import call, client

    c, found, token = client(), {}, None
    while True:
        page = call("registered models", lambda t=token: c.search_registered_models(max_results=1000, page_token=t))
        for m in page:
            found[m.name] = {"aliases": {a: str(v) for a, v in (m.aliases or {}).items()},
                             "latest": max((int(v.version) for v in m.latest_versions or []), default=0)}
        token = getattr(page, "token", None)
        if not token:
            return found


@_cached
def release_rows(store: str) -> list[dict]:
    """The verified ledger's model entries (LedgerBroken when it does not verify): what every decision reads."""
    from registry import ledger
    from registry.entries import GOVERNANCE

    return [e.as_dict() for e in ledger.verified().entries if e.model != GOVERNANCE]


def model_names(store: str) -> list[str]:
    """Names to pick from (as stored: a page that shows a broken chain must still open)."""
    from registry.entries import GOVERNANCE

    return sorted({row["model"] for row in ledger_rows(store) if row["model"] != GOVERNANCE}
                  | set(registered_models(store)))


@_cached
def overview(store: str) -> list[dict]:
    """One row per model: production and staging versions, pending approvals, the latest ledger events."""
    from registry.entries import Entry
    from registry.state import replay

    registered = registered_models(store)
    by_model: dict[str, list] = {}
    for row in release_rows(store):  # one pass over the ledger, not one per model
        by_model.setdefault(row["model"], []).append(Entry(**row))
    rows = []
    for name in sorted(set(by_model) | set(registered)):
        events = by_model.get(name, [])
        state = replay(name, events)
        rows.append({
            "model": name, "governed": bool(state.versions),
            "production": state.aliases.get("production"), "staging": state.aliases.get("staging"),
            "versions": len(state.versions) or registered.get(name, {}).get("latest", 0),
            "candidates": sum(v.stage == "candidate" for v in state.versions.values()),
            "pending": len(state.pending()),
            "pending_versions": ", ".join(f"v{r.version}→{r.to_stage}" for r in state.pending()),
            "latest_events": [f"#{e.seq} {e.ts[:16].replace('T', ' ')} {e.actor} {e.action} v{e.version or '-'}"
                              for e in reversed(events[-3:])],
            "mlflow_aliases": {a: v for a, v in registered.get(name, {}).get("aliases", {}).items()
                               if a in ("production", "staging")},
        })
    return rows


# --------------------------------------------------------------------------- versions, runs and artifacts


@_cached
def version_info(store: str, model: str, version: str) -> dict:
    """What the registry and the version's training run say about it (no download)."""
    from mlops.model_refs import describe

    d = describe(f"models:/{model}/{version}")
    return {"run_id": d.run_id, "run_tags": dict(d.run_tags), "version_tags": dict(d.version_tags),
            "aliases": list(d.aliases), "source": d.source, "profile": d.tags.get(Tag.PROFILE)}


@_cached
def run_summary(store: str, run_id: str) -> dict | None:
    from mlops.run_store import get_run

    try:
        run = get_run(run_id)
    except NotFoundError:
        return None
    return {"run_id": run_id, "name": run.info.run_name, "status": run.info.status,
            "experiment_id": run.info.experiment_id, "start": run.info.start_time, "end": run.info.end_time,
            "tags": dict(run.data.tags), "params": dict(run.data.params), "metrics": dict(run.data.metrics)}


@_cached
def run_text(store: str, run_id: str, path: str) -> str | None:
    from mlops.run_store import load_run_text

    try:
        return load_run_text(run_id, path)
    except NotFoundError:
        return None


def run_json(store: str, run_id: str | None, path: str) -> dict | None:
    text = run_text(store, run_id, path) if run_id else None
    return json.loads(text) if text else None


def run_jsonl(store: str, run_id: str | None, path: str) -> list[dict]:
    text = run_text(store, run_id, path) if run_id else None
    return [json.loads(line) for line in (text or "").splitlines() if line.strip()]


@_cached
def metric_history(store: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlops.tracking import call, client

    history = call(f"metric {key} of run {run_id}", client().get_metric_history, run_id, key)
    return sorted((m.step, m.value) for m in history)


# --------------------------------------------------------------------------- gates and evidence


@_cached
def gate_results(store: str, model: str, version: str, ledger_seq: int) -> list[dict]:
    """Every gate for a version against the current champion (`ledger_seq` keys it to the ledger's state)."""
    from registry.gates import evaluate_gates

    return [r.as_dict() for r in evaluate_gates(model_state(store, model), version)]


def gate_objects(rows: list[dict]) -> list:
    """GateResults back from cached dicts, for `registry.permissions` (so a button's check reuses them)."""
    from registry.gates import GateResult

    return [GateResult(r["gate"], r["passed"], r["detail"], r.get("evidence") or {}, r.get("overridden_by"))
            for r in rows]


@_cached
def gate_report(store: str, content_id: str) -> dict | None:
    """The newest stored gate report of a model's content, with its run id under `run_id`."""
    from registry.gates import newest_gate_report

    found = newest_gate_report(content_id) if content_id else None
    return {**found[1], "run_id": found[0]} if found else None


@_cached
def eval_run_of(store: str, model: str, version: str) -> str | None:
    """The eval run that speaks for a version: the one its newest gate report judged, else the one recorded on
    the version, else the newest eval of its content."""
    from mlops.run_store import find_runs

    info = version_info(store, model, version)
    content = info["version_tags"].get(Tag.MODEL_ID) or info["run_tags"].get(Tag.MODEL_ID)
    report = gate_report(store, content) if content else None
    judged = (((report or {}).get("settings") or {}).get("evidence") or {}).get("challenger") or {}
    if judged.get("eval_run_id"):
        return judged["eval_run_id"]
    if info["version_tags"].get(Tag.EVAL_RUN):
        return info["version_tags"][Tag.EVAL_RUN]
    runs = find_runs({Tag.STAGE: "eval", Tag.MODEL_KEY: content}, max_results=1) if content else []
    return runs[0].info.run_id if runs else None


@_cached
def chain_problems(store: str) -> dict:
    """The hash chain checked end to end (cheap: one read of the ledger and its head)."""
    from registry.audit import chain_check

    chain, problems = chain_check()
    return {"entries": len(chain.entries), "problems": problems}


@_cached
def drift(store: str, model: str) -> list[str]:
    """Where MLflow's aliases, stage tags or gate tags differ from the ledger (reads every version's tags)."""
    from registry.audit import drift as find

    return find(model_state(store, model))


@_cached
def history_at(store: str, model: str, at: str | None) -> dict:
    from registry.audit import history

    return history(model, at)


def alias_drift(state, shown: dict[str, str]) -> list[str]:
    from registry.audit import alias_drift as find

    return find(state, shown)


def aliases_now(model: str) -> dict[str, str]:
    """MLflow's aliases read now, uncached: what serving follows, shown after an action."""
    from registry.transition import registry_aliases

    return registry_aliases(model)


# --------------------------------------------------------------------------- spot-checks (blind review)


@_cached
def spot_checks(store: str, model: str) -> list[dict]:
    """Ledgered spot-checks of a model, newest first, each with its review progress and tallies."""
    from registry import spotcheck, spotcheck_store

    return [{**c, **spotcheck.summary(c["check_id"])} for c in spotcheck_store.checks_of(model)]


@_cached
def spot_items(store: str, check_id: str) -> list[dict]:
    """The items as a reviewer may see them: never which model wrote answer A or B."""
    from registry.spotcheck import blind_items

    return blind_items(check_id)


# --------------------------------------------------------------------------- served quality (`mlops monitor`)


@_cached
def quality(store: str, model: str, days: int) -> dict:
    """`mlops monitor`'s report of the model's served traffic (the same reading, policy and alerts); a window
    without traffic is {"no_traffic": the monitor's message}."""
    from evaluation.monitor import NoTraffic
    from evaluation.monitor_cli import monitor_model

    try:
        return monitor_model(model, days=days)
    except NoTraffic as err:
        return {"no_traffic": str(err)}


def quality_days(report: dict, signal: str) -> list[dict]:
    """Chart rows of one signal: per version and day, the value and its interval."""
    rows = []
    for version, entry in report["versions"].items():
        for day, summary in entry["days"].items():
            cell = summary.get(signal)
            if not cell:
                continue
            value = cell.get("rate", cell.get("value"))
            rows.append({"day": day, "version": f"v{version}", "value": value, "lo": cell["low"], "hi": cell["high"],
                         "n": cell.get("n", summary["requests"])})
    return rows
