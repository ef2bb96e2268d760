"""Models: every registered model with its production and staging versions, pending approvals, latest events."""

import pandas as pd
import streamlit as st

from app import data, ui

st.title("Models")
store = ui.store()
rows = data.overview(store)
if not rows:
    st.info("No registered model yet. Register one with `mlops registry register --run <run_id> --name <model>` "
            "(`make demo` does).")
    st.stop()

pending = sum(r["pending"] for r in rows)
a, b, c = st.columns(3)
a.metric("Models", len(rows))
b.metric("In production", sum(bool(r["production"]) for r in rows))
c.metric("Pending approvals", pending)

table = pd.DataFrame([{
    "model": r["model"],
    "production": f"v{r['production']}" if r["production"] else "—",
    "staging": f"v{r['staging']}" if r["staging"] else "—",
    "versions": r["versions"],
    "candidates": r["candidates"],
    "pending approvals": r["pending_versions"] or "—",
    "latest event": r["latest_events"][0] if r["latest_events"] else "—",
    "governed": "yes" if r["governed"] else "no: not in the ledger",
} for r in rows])
st.dataframe(table, hide_index=True, width="stretch", key="models_table")

ungoverned = [r["model"] for r in rows if not r["governed"]]
if ungoverned:
    st.warning(f"Registered in MLflow but never through the registry, so no rule or ledger covers them: "
               f"{ui.md(', '.join(ungoverned))}. Register their versions with `mlops registry register`.")

st.subheader("Details")
model = ui.pick("Model", [r["model"] for r in rows], key="model", param="model")
row = next(r for r in rows if r["model"] == model)
left, right = st.columns([1, 2])
with left:
    for alias in ("production", "staging"):
        if row[alias]:
            ui.link_version(model, row[alias], f"@{alias}: v{row[alias]}")
        else:
            st.caption(f"@{alias}: nobody")
    ledger_says = {k: row[k] for k in ("production", "staging") if row[k]}
    if row["governed"] and row["mlflow_aliases"] != ledger_says:
        st.warning(f"MLflow's aliases {ui.md(row['mlflow_aliases'] or 'none')} differ from the ledger's "
                   f"{ui.md(ledger_says or 'none')}"
                   ": they were moved outside the registry (Ledger shows the drift; an admin reconciles it).")
with right:
    st.markdown("**Latest ledger events**")
    for line in row["latest_events"] or ["none"]:
        st.markdown(f"- {ui.md(line)}")
    if row["pending"]:
        st.page_link(ui.PAGES["approvals"], label=f"{row['pending']} pending approval(s)",
                     icon=":material/how_to_reg:", query_params={"model": model})
