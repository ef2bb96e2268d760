"""Promote / Rollback: pick a version, see exactly what will change, confirm, see the result and its ledger entry.

What the page loaded (the alias targets shown) is bound to the button and sent as `expect_version`: if anyone
moved the alias since, the registry refuses instead of overwriting their change.
"""

import pandas as pd
import streamlit as st

from app import actions, data, ui
from app.compare import earlier_champions
from mlops.lineage import Tag
from registry.permissions import may_promote, may_rollback
from registry.release import STAGE_TAG

st.title("Promote / Rollback")
store = ui.store()
me = ui.actor()
model = ui.pick_model(store)
if model is None:
    st.stop()
state = data.model_state(store, model)
versions = ui.sorted_versions(state)
if not versions:
    st.info(f"'{ui.md(model)}' has no version registered through the registry.")
    st.stop()
loaded = {alias: state.aliases.get(alias) for alias in ("production", "staging")}
st.markdown(" · ".join(f"**@{a}**: {f'v{v}' if v else 'nobody'}" for a, v in loaded.items())
            + f" (ledger entry #{state.last_seq})")
mlflow_now = data.registered_models(store).get(model, {}).get("aliases", {})
if data.alias_drift(state, mlflow_now):
    st.warning(f"MLflow's aliases {ui.md(mlflow_now) or 'none'} differ from the ledger: someone moved them "
               "outside the registry. Serving follows the ledger; every move is refused until an admin runs "
               "`mlops registry reconcile`.")


def content(version: str | None) -> str:
    if not version:
        return ""
    tags = data.version_info(store, model, version)["version_tags"]
    return f" (content {ui.code(tags.get(Tag.MODEL_ID, '?'))}, profile {ui.code(tags.get(Tag.PROFILE_HASH, '?'))})"


def preview(plan, serving: bool) -> None:
    """Exactly what the registry would write: alias moves, stage changes, what serving follows."""
    entry = plan.entries[0]
    lines = [f"**@{alias}**: {f'v{before}' if before else 'nobody'} → **v{after}**"
             for alias, (before, after) in plan.aliases.items()]
    lines += [f"v{v}: {state.stage_of(v)} → **{tags[STAGE_TAG]}**" for v, tags in plan.version_tags.items()
              if STAGE_TAG in tags]
    if serving:
        before, after = plan.aliases["production"]
        lines.append(f"Serving ({ui.code(f'mlops serve --model models:/{model}@production --follow')}) moves from "
                     f"{f'v{before}' if before else 'nothing'}{content(before)} to **v{after}**{content(after)}.")
    lines.append(f"Ledger: a {ui.code(entry['action'])} entry by **{ui.md(me.name)}**, appended after "
                 f"#{state.last_seq}.")
    st.markdown("\n".join(f"- {line}" for line in lines))


# A server-side choice, not tabs: a rerun (typing a reason) must not flip the user back to another tab.
mode = st.segmented_control("Action", ["Promote", "Rollback"], key="release_action", default="Promote",
                            label_visibility="collapsed") or "Promote"
if mode == "Promote":
    version = ui.pick("Version", versions, key="promote_version", param="version",
                      fmt=lambda v: ui.version_label(state, v))
    to_stage = st.radio("To", ["production", "staging"], horizontal=True, key="promote_to")
    gates = None
    if to_stage == "production":
        with ui.guard("Gates"):
            gates = data.gate_objects(data.gate_results(store, model, version, state.last_seq))
    expect = loaded[to_stage]
    permission = may_promote(me, state, version, to_stage, expect_version=expect or "none", gates=gates)
    st.markdown("**What will change**")
    if permission.ok:
        preview(permission.plan, serving=to_stage == "production")
    else:
        st.error(f"Not possible: {ui.md(permission.reason)}")
    confirm = st.checkbox("I have checked what will change", key="promote_confirm", disabled=not permission.ok)
    st.button(f"Promote v{version} to {to_stage}", key="promote_button", type="primary",
              disabled=not (permission.ok and confirm), help=permission.reason or None, on_click=actions.promote,
              args=(model, version, to_stage, expect, "promote_confirm"))

else:
    current = loaded["production"]
    auto = may_rollback(me, state, expect_version=current or "none")
    default = auto.plan.entries[0]["version"] if auto.ok else None
    # Offered targets are the earlier champions (the registry's own choice first); the registry decides.
    targets = earlier_champions(data.entries(store, model), {current or ""})
    if default and default in targets:
        targets.remove(default)
    targets = [default, *targets] if default else targets
    if not targets:
        st.error(f"Not possible: {ui.md(auto.reason)}")
    else:
        target = ui.pick("Roll back to", targets, key="rollback_to", default=default,
                         fmt=lambda v: ui.version_label(state, v) + (" · the previous champion" if v == default
                                                                      else " · an earlier champion"))
        permission = may_rollback(me, state, to_version=target, expect_version=current or "none")
        st.text_input("Reason (required, goes into the ledger and onto the rolled-back version)",
                      key="rollback_reason")
        st.markdown("**What will change**")
        if permission.ok:
            preview(permission.plan, serving=True)
            st.caption("When you confirm, the target's files are hashed and checked against its registered content "
                       "id and checkpoint manifest first; altered or missing files refuse the rollback.")
        else:
            st.error(f"Not possible: {ui.md(permission.reason)}")
        confirm = st.checkbox("I have checked what will change", key="rollback_confirm", disabled=not permission.ok)
        st.button(f"Roll back to v{target}", key="rollback_button", type="primary",
                  disabled=not (permission.ok and confirm), help=permission.reason or None,
                  on_click=actions.rollback, args=(model, target, current, "rollback_reason", "rollback_confirm"))

result = st.session_state.get(actions.RESULT_KEY)
if result and result["entry"]["model"] == model and result["entry"]["action"] in ("promote", "rollback"):
    st.subheader("Result")
    entry = result["entry"]
    st.markdown(f"{ui.md(result['what'])}: ledger entry **#{entry['seq']}** at {ui.ts(entry['ts'])} by "
                f"**{ui.md(entry['actor'])}**, hash `{entry['hash'][:16]}` (previous `{entry['prev_hash'][:16]}`).")
    st.dataframe(pd.DataFrame([{k: entry[k] for k in ("seq", "action", "version", "from_stage", "to_stage",
                                                      "alias", "alias_before", "alias_after", "reason")}]),
                 hide_index=True, width="stretch")
    with ui.guard("Registry"):
        now = data.aliases_now(model)
        agrees = now.get(entry["alias"]) == entry["alias_after"]
        st.markdown(f"MLflow now: **@{ui.md(entry['alias'])} → v{ui.md(now.get(entry['alias']))}** "
                    + ("(agrees with the ledger)" if agrees else "(DIFFERS from the ledger: run verify)"))
