"""Altair charts: scores with their intervals per task/dimension, training curves, production over time."""

from __future__ import annotations

PALETTE = ["#d62728", "#1f77b4", "#7f7f7f", "#bcbd22", "#9467bd", "#8c564b"]  # challenger red, champion blue


def scores(rows: list[dict], order: list[str], title: str):
    """One row per unit; per model a point at the score and a bar over its interval."""
    import altair as alt
    import pandas as pd

    frame = pd.DataFrame(rows)
    color = alt.Color("model:N", sort=order, scale=alt.Scale(domain=order, range=PALETTE[:len(order)]),
                      legend=alt.Legend(orient="top", title=None, labelLimit=320))
    base = alt.Chart(frame, title=title).encode(
        y=alt.Y("unit:N", title=None, axis=alt.Axis(labelLimit=260)),
        yOffset=alt.YOffset("model:N", sort=order),
        color=color,
        tooltip=["model", "unit", "metric", alt.Tooltip("value:Q", format=".3f"), alt.Tooltip("lo:Q", format=".3f"),
                 alt.Tooltip("hi:Q", format=".3f"), "n"],
    )
    interval = base.mark_rule(strokeWidth=3, opacity=0.55).encode(
        x=alt.X("lo:Q", title="score (interval: ± z·stderr)", scale=alt.Scale(domain=[0, 1])), x2="hi:Q")
    point = base.mark_point(filled=True, size=70, opacity=1).encode(x="value:Q")
    # A fixed step per model inside each unit's band: the chart grows with its rows. (A fixed pixel height
    # collapses the bands when the y field has an offset.)
    return (interval + point).properties(height=alt.Step(13))


def curves(rows: list[dict], order: list[str], metric: str, title: str):
    import altair as alt
    import pandas as pd

    frame = pd.DataFrame([r for r in rows if r["metric"] == metric])
    if frame.empty:
        return None
    return alt.Chart(frame, title=title).mark_line(point=False, strokeWidth=2).encode(
        x=alt.X("step:Q", title="step"), y=alt.Y("value:Q", title=metric, scale=alt.Scale(zero=False)),
        color=alt.Color("model:N", sort=order, scale=alt.Scale(domain=order, range=PALETTE[:len(order)]),
                        legend=alt.Legend(orient="top", title=None)),
        tooltip=["model", "step", alt.Tooltip("value:Q", format=".4f")],
    ).properties(height=220)


def production_timeline(moves: list[dict], title: str):
    """Which version held @production over time: a step line through the ledger's alias moves."""
    import altair as alt
    import pandas as pd

    frame = pd.DataFrame([{"time": m["ts"][:26].replace("Z", ""), "version": f"v{m['alias_after']}"
                           if m["alias_after"] else "none", "action": m["action"], "who": m["actor"]}
                          for m in moves if m["alias"] == "production"])
    if frame.empty:
        return None
    frame["time"] = pd.to_datetime(frame["time"])
    return alt.Chart(frame, title=alt.TitleParams(title, anchor="start", offset=12)).mark_line(
        interpolate="step-after", point=True).encode(
        x=alt.X("time:T", title="UTC"), y=alt.Y("version:N", title="@production", sort="descending"),
        tooltip=["time:T", "version", "action", "who"],
    ).properties(height=alt.Step(28))


def quality(days: list[dict], signal: str, title: str):
    """One served-quality signal per day and version: the day's value as a line, its interval as a band.
    `days` rows: {"day", "version", "value", "lo", "hi", "n"} (rates 0-1, latency in ms)."""
    import altair as alt
    import pandas as pd

    frame = pd.DataFrame([d for d in days if d["value"] is not None])
    if frame.empty:
        return None
    frame["day"] = pd.to_datetime(frame["day"])
    order = sorted(frame["version"].unique(), key=lambda v: (len(v), v))
    color = alt.Color("version:N", sort=order, scale=alt.Scale(domain=order, range=PALETTE[:len(order)]),
                      legend=alt.Legend(orient="top", title=None))
    rate = not signal.startswith("latency")
    axis = alt.Axis(format=".0%") if rate else alt.Axis(title="ms")
    base = alt.Chart(frame, title=alt.TitleParams(title, anchor="start", offset=12)).encode(
        x=alt.X("day:T", title="UTC day"), color=color,
        tooltip=["version", alt.Tooltip("day:T"), alt.Tooltip("value:Q", format=".3f" if rate else ".0f"),
                 alt.Tooltip("lo:Q", format=".3f" if rate else ".0f"),
                 alt.Tooltip("hi:Q", format=".3f" if rate else ".0f"), "n"])
    band = base.mark_area(opacity=0.18).encode(y=alt.Y("lo:Q", title=signal, axis=axis), y2="hi:Q")
    line = base.mark_line(point=True, strokeWidth=2).encode(y="value:Q")
    return (band + line).properties(height=220)
