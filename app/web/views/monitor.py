"""Quality: served traffic per version and day (`mlops monitor`), each signal with its interval, and the alerts."""

import pandas as pd
import streamlit as st

from app import charts, data, ui
from evaluation.monitor import QUANTILES, RATES

st.title("Quality")
store = ui.store()
model = ui.pick_model(store, key="quality_model")
if model:
    days = st.slider("Days of served traffic", min_value=1, max_value=90, value=14, key="quality_days")
    with ui.guard("Quality"):
        report = data.quality(store, model, days)
        if "no_traffic" in report:
            st.warning(ui.md(report["no_traffic"]), icon=":material/signal_cellular_off:")
        else:
            policy = report["policy"]
            for a in report["alerts"]:
                st.error(f"**v{ui.md(a['version'])} {ui.md(a['signal'])}** over the last {policy['recent_days']} "
                         f"days: {a['recent']:.3g} against {ui.md(a['reference'])} (v{ui.md(a['reference_version'])}) "
                         f"{a['reference_value']:.3g}, beyond both intervals and the tolerance {a['tolerance']} "
                         f"({ui.code(a['field'])}).", icon=":material/trending_down:")
            if not report["alerts"]:
                st.success(f"No alert: every judged signal of the last {policy['recent_days']} days is within its "
                           "interval and the recorded policy's tolerance.", icon=":material/check_circle:")
            for note in report["notices"]:
                st.caption(ui.md(note))
            signal = st.radio("Signal", [*RATES, *QUANTILES], horizontal=True, key="quality_signal")
            chart = charts.quality(data.quality_days(report, signal), signal,
                                   f"{model}: {signal} per day ({policy['confidence']:.0%} intervals)")
            if chart is None:
                st.info(f"No {ui.md(signal)} values in this window.")
            else:
                st.altair_chart(chart, width="stretch")
            rows = []
            for version, entry in report["versions"].items():
                for label, cell in [("recent", entry["recent"]),
                                    *[(f"{name} (v{ref['version']})", ref) for name, ref in
                                      entry["references"].items()]]:
                    rows.append({"version": f"v{version}", "window": label, "answers": cell["requests"],
                                 **{name: cell[name]["rate"] for name in RATES},
                                 **{name: (cell[name] or {}).get("value") for name in QUANTILES}})
            st.subheader("Recent days against the references")
            st.dataframe(pd.DataFrame(rows), hide_index=True)
