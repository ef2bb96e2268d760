"""Approvals: the queue of pending requests, approve or reject with a comment, and asking for a release."""

import streamlit as st

from app import actions, data, lineage, ui
from registry.permissions import may_decide, may_request

st.title("Approvals")
store = ui.store()
me = ui.actor()
names = data.model_names(store)
ALL = "all models"
only = ui.pick("Requests for", [ALL, *names], key="queue_model", param="model")
queue = [(name, r) for name in names if only in (ALL, name) for r in data.model_state(store, name).pending()]
st.markdown(f"**{len(queue)}** pending request(s).")

for model, req in sorted(queue, key=lambda item: item[1].ts):
    state = data.model_state(store, model)
    key = f"{model}-{req.version}-{req.seq}"
    with st.container(border=True):
        st.markdown(f"#### {ui.md(model)} v{ui.md(req.version)} → {ui.md(req.to_stage)}")
        st.markdown(f"Requested by **{ui.md(req.requester)}** at {ui.ts(req.ts)}: {ui.md(req.comment)}  \n"
                    f"Trained by **{ui.md(state.versions[req.version].trainer or 'unknown')}**, registered by "
                    f"**{ui.md(state.versions[req.version].registered_by)}** · now "
                    f"{ui.md(state.stage_of(req.version))}")
        gates = []
        with ui.guard("Gates"):
            gates = data.gate_results(store, model, req.version, state.last_seq)
            st.markdown("  \n".join(f"{ui.OK if g['ok'] else ui.BAD} **{ui.md(g['gate'])}**: "
                                    f"{ui.md(lineage.gate_row(g)['result'])}: {ui.md(g['detail'])}" for g in gates))
        left, right = st.columns(2)
        left.page_link(ui.PAGES["version"], label="Lineage and evidence", icon=":material/account_tree:",
                       query_params={"model": model, "version": req.version})
        right.page_link(ui.PAGES["compare"], label="Compare with the champion", icon=":material/compare_arrows:",
                        query_params={"model": model, "version": req.version})
        objects = data.gate_objects(gates) if gates else None
        approve = may_decide(me, state, req.version, approve=True, gates=objects)
        reject = may_decide(me, state, req.version, approve=False)
        st.text_input("Comment (required, goes into the ledger)", key=f"comment-{key}",
                      disabled=not (approve.ok or reject.ok))
        a, r = st.columns(2)
        with a:
            st.button("Approve", key=f"approve-{key}", type="primary", disabled=not approve.ok,
                      help=approve.reason or None, on_click=actions.decide,
                      args=(model, req.version, True, f"comment-{key}"))
            ui.denied(approve)
        with r:
            st.button("Reject", key=f"reject-{key}", disabled=not reject.ok, help=reject.reason or None,
                      on_click=actions.decide, args=(model, req.version, False, f"comment-{key}"))
            ui.denied(reject)

st.subheader("Ask for a release")
model = ui.pick("Model", names, key="request_model", default=None if only == ALL else only) if names else None
if model:
    state = data.model_state(store, model)
    versions = ui.sorted_versions(state)
    if versions:
        version = ui.pick("Version", versions, key="request_version", fmt=lambda v: ui.version_label(state, v))
        to_stage = st.radio("To", ["production", "staging"], horizontal=True, key="request_to")
        permission = may_request(me, state, version, to_stage)
        st.text_input("Comment (required)", key="request_comment", disabled=not permission.ok)
        st.button("Request approval", key="request_button", disabled=not permission.ok,
                  help=permission.reason or None, on_click=actions.request,
                  args=(model, version, to_stage, "request_comment"))
        ui.denied(permission)
