"""Version: the full lineage chain, the deployment profile, gates with reasons, contamination, capacity, its
ledger."""

import pandas as pd
import streamlit as st
import yaml

from app import actions, data, datareview, lineage, ui
from mlops.lineage import Tag
from registry.gates import GATES
from registry.permissions import may_override

st.title("Version")
store = ui.store()
model = ui.pick_model(store)
if model is None:
    st.stop()
state = data.model_state(store, model)
versions = ui.sorted_versions(state) or [str(v) for v in range(data.registered_models(store).get(model, {})
                                                                  .get("latest", 0), 0, -1)]
if not versions:
    st.info(f"'{ui.md(model)}' has no versions yet.")
    st.stop()
version = ui.pick("Version", versions, key="version", param="version", fmt=lambda v: ui.version_label(state, v))
info = data.version_info(store, model, version)
tags = {**info["run_tags"], **info["version_tags"]}
vs = state.versions.get(version)
run = data.run_summary(store, info["run_id"]) if info["run_id"] else None

# --------------------------------------------------------------------------- header
held = [f"@{a}" for a, v in state.aliases.items() if v == version]
st.header(f"{ui.md(model)} v{ui.md(version)}")
st.markdown(f"**Stage:** {ui.md(vs.stage if vs else 'not in the ledger')} {ui.md(' '.join(held))} · "
            f"**registered by** {ui.md(vs.registered_by if vs else '?')} at "
            f"{ui.ts(vs.registered_ts) if vs else '?'} · **content** {ui.code(tags.get(Tag.MODEL_ID, '?'))}")
if vs is None:
    st.warning("This version was registered in MLflow directly, not through the registry: no ledger entry, no "
               "gates, no approvals cover it. Register it with `mlops registry register`.")
if vs and vs.stage == "rolled_back":
    st.error(f"Rolled back: {ui.md(vs.stage_reason)}")
for o in vs.overrides if vs else []:
    st.warning(f"Gate override ({ui.md(o['gate'])}) by {ui.md(o['by'])} at {ui.ts(o['ts'])}: "
               f"{ui.md(o['reason'])}")

# --------------------------------------------------------------------------- lineage chain
st.subheader("Lineage")
data_run = tags.get(Tag.DATA_RUN)
checkpoint = lineage.run_path(tags.get(Tag.CHECKPOINT_MANIFEST))
eval_run = None
with ui.guard("Evidence"):
    eval_run = data.eval_run_of(store, model, version)
report = data.gate_report(store, tags.get(Tag.MODEL_ID, "")) if vs else None
chain = [("data snapshot", tags.get(Tag.SNAPSHOT_ID), data_run),
         ("training run", (run or {}).get("name") or "", info["run_id"]),
         ("checkpoint", checkpoint[1].split("/")[-2] if checkpoint else "not recorded",
          checkpoint[0] if checkpoint else None), ("model version", f"v{version}", None),
         ("eval run", "results stored" if eval_run else "none", eval_run),
         ("gate run", (report or {}).get("result") or "none", (report or {}).get("run_id"))]
for col, (what, label, run_id) in zip(st.columns(len(chain)), chain, strict=True):
    col.markdown(f"**{what}** {'→' if what != 'gate run' else ''}  \n{ui.md(label) or '—'}  \n"
                 f"{ui.run_ref(run_id) if run_id else ''}")

tab_train, tab_data, tab_ckpt, tab_profile, tab_sweep = st.tabs(
    ["Training run", "Data snapshot", "Checkpoint", "Deployment profile", "Sweep trial"])
with tab_train, ui.guard("Training run"):
    st.markdown(f"Run {ui.run_ref(info['run_id'], run and run['experiment_id'])}")
    st.markdown("| | |\n|---|---|\n" + "\n".join(f"| {ui.md(k)} | {ui.md(v)} |"
                                                  for k, v in lineage.training_facts(tags, run)))
    resolved = data.run_text(store, info["run_id"], "config/resolved.yaml") if info["run_id"] else None
    with st.expander("Resolved config"):
        st.code(resolved or "the run stored no config/resolved.yaml", language="yaml")
with tab_data, ui.guard("Data snapshot"):
    manifest = data.run_json(store, data_run, "snapshot/manifest.json")
    if manifest is None:
        st.warning(f"No snapshot manifest: data run {ui.md(data_run or 'not recorded')} stored no "
                   "snapshot/manifest.json.")
    else:
        s = lineage.manifest_summary(manifest)
        st.markdown(f"Snapshot {ui.code(s['snapshot_id'])} ({ui.md(s['name'])}), built {ui.md(s['created'])} by "
                    f"data run {ui.run_ref(data_run)}. Samples: "
                    + (", ".join(f"{ui.md(k)} {ui.md(v)}" for k, v in s["samples"].items()) or "not recorded"))
        q = st.columns(len(s["quarantine"]))
        for col, (label, value) in zip(q, s["quarantine"].items(), strict=True):
            col.metric(ui.md(label), value)
        st.markdown("**Great Expectations, per batch**")
        st.dataframe(pd.DataFrame(s["batches"]), hide_index=True, width="stretch")
        from mlops.data.acceptance import describe as acceptance_lines
        from mlops.data.review import describe_review, snapshot_review

        review = snapshot_review(s["snapshot_id"] or tags.get(Tag.SNAPSHOT_ID))
        # The data run's copy of the manifest, else the snapshot's own (a run logged before reports existed).
        accept = manifest.get("acceptance") or (datareview.local_acceptance(review["snapshot_id"])
                                                if review["found"] else None)
        if accept:
            v, seq, frag = accept["verdict"], accept["sequence"], accept["fragmentation"]
            st.markdown(f"**Acceptance {ui.md(v['status'])}**: rejected {v['rejected_share']:.1%} of "
                        f"{ui.md(accept['rejected']['rows_read'])} rows read (limit {v['max_rejected_share']:.1%}) · "
                        f"suggested {ui.md('max_seq_len')} {ui.md(seq['suggested_max_seq_len'])} (p99 "
                        f"{ui.md(seq['p99'])} tokens; {ui.md(seq['chosen_max_seq_len'])} truncates "
                        f"{seq['truncated_share_at_chosen']:.1%}) · {ui.md(frag['tokens_per_word'])} tokens/word "
                        f"(x{ui.md(frag['ratio_to_baseline'])} general text)")
        else:
            st.markdown("**Acceptance** not measured (built before acceptance reports)")
        with st.expander("Acceptance report"):
            st.code("\n".join(acceptance_lines(accept)), language=None)
        st.markdown(f"**Human review:** {ui.md(describe_review(review))}")
        status = review["status"]
        if status and status["bad_reasons"]:
            st.dataframe(pd.DataFrame(list(status["bad_reasons"].items()), columns=["bad reason", "samples"]),
                         hide_index=True)
        if review["found"]:
            st.page_link(ui.PAGES["datareview"], label="Review this snapshot's sample",
                         query_params={"snapshot": review["snapshot_id"]})
        if s["counters"]:
            with st.expander("Every manifest counter"):
                st.dataframe(pd.DataFrame(list(s["counters"].items()), columns=["counter", "value"]),
                             hide_index=True)
with tab_ckpt, ui.guard("Checkpoint"):
    ck = data.run_json(store, checkpoint[0], checkpoint[1]) if checkpoint else None
    st.markdown(f"Manifest {ui.code(tags.get(Tag.CHECKPOINT_MANIFEST, 'not recorded'))}")
    if ck:
        st.markdown(f"Step {ui.md(ck.get('step'))} · complete: {ui.md(ck.get('complete'))} · "
                    f"{len(ck.get('files') or {})} files")
        st.dataframe(pd.DataFrame(lineage.checkpoint_rows(ck)), hide_index=True, width="stretch")
    else:
        st.warning("The checkpoint manifest cannot be read.")
with tab_profile, ui.guard("Deployment profile"):
    profile = yaml.safe_load(info["profile"]) if info["profile"] else None
    if not profile:
        st.warning("No deployment profile is stored with this version.")
    else:
        st.markdown(f"Profile hash {ui.code(tags.get(Tag.PROFILE_HASH, '?'))} · chat template hash "
                    f"{ui.code(str(profile.get('chat_template_hash'))[:16])} · max context "
                    f"{ui.md(profile.get('max_context'))} · stop {ui.md(profile.get('stop') or 'none')}")
        st.markdown("**System prompt**")
        st.code(profile.get("system_prompt") or "(none)", language=None, wrap_lines=True)
        st.markdown("**Sampling**")
        st.dataframe(pd.DataFrame([profile.get("sampling") or {}]), hide_index=True)
with tab_sweep:
    trial = lineage.sweep_trial(tags)
    if trial:
        st.dataframe(pd.DataFrame([trial]), hide_index=True)
    else:
        st.caption("Not trained by a sweep trial.")

# --------------------------------------------------------------------------- gates and contamination
st.subheader("Gates")
gates = []
with ui.guard("Gates"):
    if vs:
        gates = data.gate_results(store, model, version, state.last_seq)
        for g in gates:
            row = lineage.gate_row(g)
            st.markdown(f"{ui.OK if g['ok'] else ui.BAD} **{ui.md(g['gate'])}**: {ui.md(row['result'])}: "
                        f"{ui.md(g['detail'])}")
            if row["evidence"]:
                st.caption(f"evidence: {ui.md(row['evidence'])}")
    else:
        st.info("Gates are evaluated only for versions registered through the registry.")
if vs:
    with st.expander("Override a gate (admin; ledgered and shown on this version for good)"):
        gate = st.selectbox("Gate", [*GATES, "all"], key="override_gate")
        permission = may_override(ui.actor(), state, version, gate)
        st.text_input("Reason (required)", key="override_reason")
        st.button("Override", key="override_button", disabled=not permission.ok, help=permission.reason or None,
                  on_click=actions.override, args=(model, version, gate, "override_reason"))
        ui.denied(permission)

st.subheader("Contamination")
with ui.guard("Contamination"):
    found = data.run_json(store, eval_run, "eval/contamination.json")
    if found is None:
        st.warning(f"No contamination report (eval run: {ui.md(eval_run or 'none')}).")
    else:
        count = len(found.get("offending") or [])
        verdict = "clean" if found.get("status") == "checked" and not count else f"{count} offending items"
        st.markdown(f"Status **{ui.md(found.get('status'))}**, {ui.md(verdict)}; "
                    f"{ui.md(found.get('items_checked', '?'))} items checked with {ui.md(found.get('ngram', '?'))}"
                    f"-grams against snapshot {ui.code(tags.get(Tag.SNAPSHOT_ID))}.")
        if count:
            st.dataframe(pd.DataFrame(found["offending"]), hide_index=True, width="stretch")

st.subheader("Capacity")
with ui.guard("Capacity"):
    capacity = data.run_json(store, tags.get(Tag.CAPACITY_RUN), "capacity/capacity.json")
    if capacity is None:
        st.caption(f"Not measured. Run {ui.code(f'mlops release capacity models:/{model}/{version}')} before release.")
    else:
        st.markdown(f"On **{ui.md(capacity['deployment_form'])}**, {ui.md(capacity['max_tokens'])} new tokens per "
                    f"streamed chat (measured {ui.md(capacity['measured'])}): ceiling **{capacity['ceiling_tokens_per_s']:.1f} tok/s**, "
                    f"knee at **c={ui.md(capacity['knee']['concurrency'])}**; soak RSS drift {capacity['rss_drift']:.2f}, "
                    f"tokens/s drift {capacity['tokens_per_s_drift']:.2f}, failures {ui.md(capacity['failures'])}.")
        st.dataframe(pd.DataFrame(capacity["levels"])[["concurrency", "tokens_per_s", "p50_ms", "p95_ms", "p99_ms",
                                                        "ttft_p50_ms", "failures"]], hide_index=True)

st.subheader("Ledger")
mine = [e.as_dict() for e in data.entries(store, model) if e.version == version]
if mine:
    st.dataframe(pd.DataFrame([{"#": e["seq"], "when": ui.ts(e["ts"]), "who": e["actor"], "action": e["action"],
                                "stage": f"{e['from_stage'] or '-'} → {e['to_stage'] or '-'}",
                                "reason": e["reason"] or ""} for e in mine]), hide_index=True, width="stretch")
else:
    st.caption("No ledger entry names this version.")
