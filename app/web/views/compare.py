"""Compare: challenger vs champion and earlier champions: scores with intervals, the gate's deltas, the samples
that changed, and the training curves."""

import pandas as pd
import streamlit as st

from app import charts, data, ui
from app import compare as cmp
from app.config import settings
from mlops.lineage import Tag

st.title("Compare")
store = ui.store()
model = ui.pick_model(store)
if model is None:
    st.stop()
state = data.model_state(store, model)
versions = ui.sorted_versions(state)
if not versions:
    st.info(f"'{ui.md(model)}' has no version registered through the registry.")
    st.stop()
champion = state.aliases.get("production")
pending = [r.version for r in state.pending() if r.to_stage == "production"]
candidates = [v for v in versions if v != champion]
default = (pending[0] if pending else None) or next((v for v in candidates if state.stage_of(v) == "candidate"),
                                                     None)
left, right = st.columns([1, 2])
with left:
    challenger = ui.pick("Challenger", candidates or versions, key="challenger", param="version",
                         fmt=lambda v: ui.version_label(state, v), default=default)
earlier = cmp.earlier_champions(data.entries(store, model), {champion or "", challenger})
with right:
    history = st.multiselect("Earlier champions", earlier, default=earlier[:2], key="history",
                             format_func=lambda v: ui.version_label(state, v))
st.caption(f"Champion: {ui.md(ui.version_label(state, champion)) if champion else 'none yet (the gate used floors)'}")

label = {challenger: f"challenger v{challenger}"}
if champion:
    label[champion] = f"champion v{champion}"
label.update({v: f"earlier champion v{v}" for v in history})
order = list(label.values())

# --------------------------------------------------------------------------- scores
report = None
with ui.guard("Gate report"):
    info = data.version_info(store, model, challenger)
    report = data.gate_report(store, info["version_tags"].get(Tag.MODEL_ID, ""))
z = float(((report or {}).get("settings") or {}).get("z") or cmp.default_z())
summaries, eval_runs = {}, {}
with ui.guard("Eval results"):
    for v in label:
        eval_runs[v] = data.eval_run_of(store, model, v)
        summaries[v] = data.run_json(store, eval_runs[v], "eval/summary.json")
missing = [label[v] for v in label if not summaries.get(v)]
if missing:
    st.warning(f"No stored eval results for: {ui.md(', '.join(missing))}. Run `mlops eval` on them.")
rows = [r for v in label if summaries.get(v) for r in cmp.score_rows(label[v], summaries[v], z)]
st.subheader("Scores")
st.caption(f"Points are scores, bars their intervals (± {z:g} stderr, the gate's z).")
for group, title in (("general task", "General tasks"), ("business dimension", "Business dimensions")):
    mine = [r for r in rows if r["group"] == group]
    if mine:
        shown = [o for o in order if any(r["model"] == o for r in mine)]
        st.altair_chart(charts.scores(mine, shown, title), width="stretch")

st.subheader("Gate")
with ui.guard("Gate"):
    if report is None:
        st.warning(f"v{ui.md(challenger)} has no stored gate report. Run "
                   + ui.code(f"mlops gate --challenger models:/{model}/{challenger} --champion "
                             f"models:/{model}@production") + ".")
    else:
        eval_gate = next((g for g in data.gate_results(store, model, challenger, state.last_seq)
                          if g["gate"] == "eval"), None) if challenger in state.versions else None
        verdict = (report.get("result") or "?").upper()
        st.markdown(f"Gate run {ui.run_ref(report['run_id'])}: **{ui.md(verdict)}** · challenger "
                    f"{ui.code(report.get('challenger'))} vs {ui.code(report.get('champion') or 'floors')}")
        if eval_gate and not eval_gate["ok"]:
            st.error(f"Release gate: {ui.md(eval_gate['detail'])}")
        checks = cmp.check_rows(report)
        st.dataframe(pd.DataFrame(checks), hide_index=True, width="stretch", height=38 + 35 * max(1, len(checks)),
                     column_config={"reason": st.column_config.TextColumn(width="large")})

# --------------------------------------------------------------------------- samples
st.subheader("Sample-level differences")
if not champion or not summaries.get(champion) or not summaries.get(challenger):
    st.caption("Needs stored eval results of both the challenger and the champion.")
else:
    metrics = cmp.task_metrics(summaries[challenger])
    shared = [t for t in metrics if t in cmp.task_metrics(summaries[champion])]
    task = ui.pick("Task", shared, key="task", param="task") if shared else None
    if task:
        with ui.guard("Samples"):
            path = f"eval/samples/{task}.jsonl"
            diff = cmp.sample_diff(data.run_jsonl(store, eval_runs[champion], path),
                                   data.run_jsonl(store, eval_runs[challenger], path), metrics[task])
            limit = settings().max_samples
            for key, title in (("newly_failed", "Newly failed"), ("newly_passed", "Newly passed")):
                found = diff[key]
                st.markdown(f"**{title}** by v{ui.md(challenger)} on {ui.code(task)}: {len(found)}"
                            + (f" (first {limit} shown)" if len(found) > limit else ""))
                if found:
                    st.markdown(cmp.markdown_table(found[:limit]))

# --------------------------------------------------------------------------- training curves
st.subheader("Training curves")
with ui.guard("Training curves"):
    curve = []
    for v in [challenger, champion] if champion else [challenger]:
        run_id = data.version_info(store, model, v)["run_id"]
        if run_id:
            curve += cmp.curve_rows(label[v], {k: data.metric_history(store, run_id, k) for k in cmp.CURVES})
    shown = [label[challenger]] + ([label[champion]] if champion else [])
    cols = st.columns(len(cmp.CURVES))
    for col, metric in zip(cols, cmp.CURVES, strict=True):
        chart = charts.curves(curve, shown, metric, metric.replace("_", " "))
        if chart is None:
            col.caption(f"No {metric} logged.")
        else:
            col.altair_chart(chart, width="stretch")
