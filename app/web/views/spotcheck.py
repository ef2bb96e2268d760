"""Spot-check: a person with domain knowledge reviews a version's sample blind, one verdict per item.

Answers are shown as A and B in the order the registry drew; which one the challenger wrote stays in the database
(registry.spotcheck). Creating a check is `mlops registry spot-check <model> <version>`; this page records the
review, and the registry refuses reviewers without the role or who trained or registered the version.
"""

import streamlit as st

from app import actions, data, ui
from registry.permissions import may_review_spot_check

st.title("Spot-check")
store = ui.store()
me = ui.actor()
model = ui.pick_model(store, key="spot_model")
checks = data.spot_checks(store, model) if model else []
if model and not checks:
    st.info(f"No spot-check of '{ui.md(model)}' yet. Draw one with "
            f"{ui.code(f'mlops registry spot-check {model} <version> --n 30')} (it answers the sample with the challenger and the champion, in deployment form).")
if checks:
    by_id = {c["check_id"]: c for c in checks}
    open_first = sorted(by_id, key=lambda cid: (by_id[cid]["complete"], -int(by_id[cid]["create_seq"] or 0)))

    def label(cid: str) -> str:
        c = by_id[cid]
        against = ("v" + c["champion_version"] if c["champion_version"]
                   else "base " + c["baseline"] if c.get("baseline") else "no champion")
        return f"{cid} · v{c['version']} vs {against} · {c['reviewed']}/{c['items']} reviewed"

    check = by_id[ui.pick("Check", open_first, key="spot_check_id", param="check", fmt=label)]
    tallies = check["tallies"]
    st.markdown(f"v{check['version']} of **{ui.md(check['model'])}**, drawn by **{ui.md(check['created_by'])}** at "
                f"{ui.ts(check['created_ts'])}; strata {ui.md(check['strata'])}.  \n"
                f"Reviewed {check['reviewed']} of {check['items']} · same or better "
                f"{tallies['share_same_or_better']:.0%} · wrong facts {tallies['wrong_fact']} · reviewers "
                f"{ui.md(', '.join(tallies['reviewers']) or 'none yet')}")
    permission = may_review_spot_check(me, data.model_state(store, model), check)
    ui.denied(permission)
    items = data.spot_items(store, check["check_id"])
    show_done = st.toggle("Show items already reviewed", value=False, key="spot_show_done")
    prefix = f"spot-{check['check_id']}"
    shown = [i for i in items if show_done or i["preferred"] is None]
    if not shown:
        st.success("Every item has a verdict. Change one by showing the reviewed items.")
    with st.form(f"{prefix}-form", border=False):
        for item in shown:
            n = item["item"]
            with st.container(border=True):
                st.markdown(f"**Item {n}** · {ui.md(item['stratum'])} · {ui.md(item['source'])}")
                question = [m["content"] for m in item["prompt"] if m.get("role") == "user"]
                st.markdown(f"**Prompt:** {ui.md(question[-1] if question else item['prompt'])}")
                if item["reference"]:
                    st.caption(f"Reference: {ui.md(item['reference'])}")
                columns = st.columns(2 if item["answer_b"] is not None else 1)
                columns[0].markdown(f"**Answer A**  \n{ui.md(item['answer_a'])}")
                if item["answer_b"] is not None:
                    columns[1].markdown(f"**Answer B**  \n{ui.md(item['answer_b'])}")
                choices = item["choices"]
                st.radio("Which is better?", choices, horizontal=True, key=f"{prefix}-pref-{n}",
                         index=choices.index(item["preferred"]) if item["preferred"] in choices else None)
                letters = ["A", "B"] if item["answer_b"] is not None else ["A"]
                st.multiselect("States a wrong fact", letters, default=[x for x in item["wrong_fact"] if x in letters],
                               key=f"{prefix}-wrong-{n}")
                st.text_input("Note (required to explain a wrong fact that is acceptable)", value=item["note"],
                              key=f"{prefix}-note-{n}")
        st.form_submit_button("Record verdicts", type="primary", disabled=not (permission.ok and shown),
                              on_click=actions.spot_check, args=(check["check_id"], [i["item"] for i in shown], prefix))
