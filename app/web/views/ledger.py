"""Ledger: the chain's verification, what was in production at time T, and the timeline with its evidence."""

import json

import pandas as pd
import streamlit as st

from app import charts, data, ui

st.title("Ledger")
store = ui.store()
names = data.model_names(store)
ALL = "all models"
model = ui.pick("Model", [ALL, *names], key="ledger_model", param="model", default=names[0] if names else ALL)
scope = None if model == ALL else model

# --------------------------------------------------------------------------- verification
with ui.guard("Verification"):
    chain = data.chain_problems(store)
    if scope:
        drift = data.drift(store, scope)
    elif st.toggle("Also check every model's aliases and tags against the ledger (reads every version)",
                   key="drift_all"):
        drift = [f"{name}: {p}" for name in names for p in data.drift(store, name)]
    else:
        drift = None
    if chain["problems"]:
        st.error("The chain is BROKEN: " + " ".join(f"{ui.md(p)}." for p in chain["problems"][:5])
                 + " Run `mlops registry verify` for the full list.", icon=":material/gpp_bad:")
    else:
        st.success(f"Chain verified: {chain['entries']} entries, each linked to the one before by its hash.",
                   icon=":material/verified:")
    if drift:
        st.error("MLflow differs from the ledger: " + ui.md("; ".join(drift[:8])) + ". An admin repairs it with "
                 "`mlops registry reconcile <model>`.", icon=":material/sync_problem:")
    elif drift is not None:
        st.success("MLflow's aliases and stage tags agree with the ledger" + (f" for {ui.md(scope)}." if scope else "."),
                   icon=":material/sync:")
    if st.button("Verify again now", key="verify_now", icon=":material/refresh:"):
        data.invalidate()
        st.rerun()

# What a viewer sees of an entry: password hashes and key material (an older ledger's user entries, a mistaken
# evidence field) are replaced before anything is drawn, the table and the JSON alike.
rows = [ui.redacted(e.as_dict()) for e in data.entries(store, scope)]

# --------------------------------------------------------------------------- production at time T
if scope:
    st.subheader("Production at time T")
    at = st.text_input("Time T (ISO, UTC unless it names an offset; empty = now)", key="at_time",
                       placeholder="2026-11-30T18:00:00Z").strip() or None
    with ui.guard("History"):
        then = data.history_at(store, scope, at)
        held = then["aliases"].get("production")
        last = next((m for m in reversed(then["moves"]) if m["alias"] == "production"), None)
        st.markdown(f"At {ui.ts(then['at']) if then['at'] else 'this moment'}: **@production → {f'v{held}' if held else 'nobody'}**"
                    + (f", since entry #{last['seq']} ({ui.md(last['action'])} by {ui.md(last['actor'])} at "
                       f"{ui.ts(last['ts'])})."
                       if last and held else "."))
        chart = charts.production_timeline([r for r in rows if r["alias"]], f"@production of {scope}")
        if chart is not None:
            st.altair_chart(chart, width="stretch")
        if held:
            ui.link_version(scope, held, f"Open v{held}")

# --------------------------------------------------------------------------- timeline
st.subheader("Timeline")


def evidence_brief(e: dict) -> str:
    ev = e["evidence"] or {}
    parts = [f"{k}={ev[k]}" for k in ("run_id", "snapshot_id", "content_id", "gate", "request_seq", "approved_by",
                                      "displaced") if ev.get(k)]
    if ev.get("gates"):
        parts.append("gates " + ",".join(f"{g['gate']}:{'ok' if g['ok'] else 'FAIL'}" for g in ev["gates"]))
    return "; ".join(parts)


table = pd.DataFrame([{
    "#": e["seq"], "when": ui.ts(e["ts"]), "who": e["actor"], "action": e["action"], "model": e["model"],
    "version": e["version"] or "", "stage": f"{e['from_stage'] or '-'} → {e['to_stage']}" if e["to_stage"] else "",
    "alias": f"@{e['alias']}: {e['alias_before'] or '-'} → {e['alias_after'] or '-'}" if e["alias"] else "",
    "reason": e["reason"] or "", "evidence": evidence_brief(e), "hash": e["hash"][:12],
} for e in reversed(rows)])
st.dataframe(table, hide_index=True, width="stretch", height=min(600, 38 + 35 * max(1, len(table))),
             column_config={"reason": st.column_config.TextColumn(width="medium"),
                            "evidence": st.column_config.TextColumn(width="large")})

st.subheader("Entry")
if rows:
    by_seq = {str(e["seq"]): e for e in rows}
    seq = ui.pick("Entry", list(reversed(by_seq)), key="ledger_entry", param="entry",
                  fmt=lambda s: f"#{s} {by_seq[s]['action']} {by_seq[s]['model']} v{by_seq[s]['version'] or '-'} by "
                                f"{by_seq[s]['actor']}")
    entry = by_seq[seq]
    left, right = st.columns([1, 2])
    with left:
        st.markdown(f"**#{entry['seq']}** {ui.md(entry['action'])} by **{ui.md(entry['actor'])}** at "
                    f"{ui.ts(entry['ts'])}  \n"
                    f"hash {ui.code(entry['hash'][:16])} · previous {ui.code(entry['prev_hash'][:16])}")
        if entry["version"]:
            ui.link_version(entry["model"], entry["version"], f"{entry['model']} v{entry['version']}")
        ev = entry["evidence"] or {}
        for key in ("run_id", "gate_run", "eval_run", "data_run"):
            if ev.get(key):
                st.markdown(f"{ui.md(key)}: {ui.run_ref(ev[key])}")
        for g in ev.get("gates") or []:
            for key in ("gate_run", "eval_run", "data_run"):
                if (g.get("evidence") or {}).get(key):
                    st.markdown(f"{ui.md(g['gate'])} gate {ui.md(key)}: {ui.run_ref(g['evidence'][key])}")
    with right:
        st.code(json.dumps(entry["evidence"], indent=2, sort_keys=True, default=str), language="json")
