"""Data review: a person judges a drawn sample of a snapshot's kept records (ok, or bad with a reason).

The sample is what `mlops data review <snapshot> --n 200` draws (seeded, stratified by domain, redacted as stored,
the text training reads); the verdicts are stored beside the snapshot by the same function `mlops data review
--verdicts` calls, so a snapshot built with `data.accept.require_review` can be trained on once the review is
complete. The sample's text is shown as plain text (`st.code`), never as Markdown.
"""

import streamlit as st

from app import datareview, ui
from mlops.data.acceptance import describe as acceptance_lines
from mlops.data.review import describe_review, snapshot_review

st.title("Data review")
me = ui.actor()
found = datareview.snapshots()
if not found:
    st.info("No snapshot in this project's store yet. Build one with `mlops data build --config <yaml>` "
            "(`make demo` does).")
    st.stop()
by_id = {m["snapshot_id"]: m for m in found}


def label(sid: str) -> str:
    m = by_id[sid]
    return f"{sid} · {m.get('name', '')} · {m.get('created_at', '')}"


sid = ui.pick("Snapshot", list(by_id), key="review_snapshot", param="snapshot", fmt=label)
folder = datareview.folder_of(sid)
manifest = by_id[sid]
verdict = ((manifest.get("acceptance") or {}).get("verdict") or {}).get("status", "not measured")
st.markdown(f"**Acceptance:** {ui.md(verdict)} · **human review:** {ui.md(describe_review(snapshot_review(sid)))}")
with st.expander("Acceptance report"):
    st.code("\n".join(acceptance_lines(manifest.get("acceptance"))), language=None)

permission = datareview.may_review(me)
ui.denied(permission)
drawn, items = datareview.current_draw(folder)
with st.expander("Draw a sample", expanded=items is None):
    if drawn and items is None:
        st.warning(f"The latest draw ({ui.md(drawn['n'])} samples at {ui.md(drawn['drawn_at'])}) was written outside "
                   "this store (`--out`). Store its verdicts with `mlops data review --verdicts`, or draw again here "
                   "(the new draw replaces it).")
    left, right = st.columns(2)
    left.number_input("Samples", min_value=1, max_value=1000, value=int((drawn or {}).get("asked") or 200),
                      key="review_n", help="stratified by domain, in proportion to each domain's share")
    right.number_input("Seed", min_value=0, value=int((drawn or {}).get("seed", 7)), key="review_seed",
                       help="the same seed draws the same sample")
    st.button("Draw" if drawn is None else "Draw again (replaces the current draw)", key="review_draw",
              disabled=not permission.ok, on_click=datareview.draw_sample,
              args=(sid, "review_n", "review_seed"))

if items:
    prior = datareview.prior_verdicts(folder)
    prefix = f"review-{sid}-{drawn['drawn_at']}"
    st.caption(f"{len(items)} samples drawn at {ui.md(drawn['drawn_at'])} (seed {ui.md(drawn['seed'])}; per domain "
               + ", ".join(f"{ui.md(d)} {n}" for d, n in sorted(drawn["per_domain"].items())) + "). The text is as "
               "stored: PII was replaced before tokenization; the trained-on part is what the loss sees.")
    with st.form(f"{prefix}-form", border=False):
        for i, item in enumerate(items):
            before = prior.get(str(item["sample_id"]), {})
            with st.container(border=True):
                st.markdown(f"**Sample {i + 1}** · {ui.md(item['domain'])} · {ui.md(item['split'])} · "
                            f"{ui.code(item['sample_id'])} · from {ui.md(item['source'] or '?')}")
                st.code(item["text"], language=None, wrap_lines=True)
                with st.expander("Trained on (loss tokens only)"):
                    st.code(item["trained_on"], language=None, wrap_lines=True)
                choices = ["ok", "bad"]
                st.radio("Verdict", choices, horizontal=True, key=f"{prefix}-verdict-{i}",
                         index=choices.index(before["verdict"]) if before.get("verdict") in choices else None)
                st.text_input("Reason (required for bad)", value=before.get("reason", ""),
                              key=f"{prefix}-reason-{i}")
        st.form_submit_button("Save verdicts", type="primary", key="review_save", disabled=not permission.ok,
                              on_click=datareview.save_verdicts,
                              args=(sid, [str(i["sample_id"]) for i in items], prefix))
