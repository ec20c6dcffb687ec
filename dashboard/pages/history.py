"""History: one benchmark across commits, with significant changes flagged."""

import html

import plotly.graph_objects as go
import streamlit as st

from _view import page_data, pick, pick_many, table
from speedlib import report

st.title("History across commits")
df = page_data()
timed = sorted(df[df["kind"] == "time"]["benchmark"].unique())  # a timing is the usual question
benchmark = pick("Benchmark", sorted(df["benchmark"].unique()), key="benchmark", default=timed[0] if timed else None)
rows = df[df["benchmark"] == benchmark]
c1, c2 = st.columns(2)
with c1:
    machines = pick_many("Machines", sorted(rows["machine"].unique()), key="machine")
with c2:
    params = pick_many("Parameters", sorted(rows["params"].unique()), key="params")
rows = rows[rows["machine"].isin(machines) & rows["params"].isin(params)]
history = report.history_table(rows, benchmark)
h = history.sources  # the rows with their change and flag
if h["commit"].nunique() < 2:
    st.info("Only one commit is measured for this selection: a history needs two or more "
            "(`speedlib run --commits A..B` measures a range).")

scale, unit = (1e3, "ms") if (h["unit"] == "seconds").all() else (1.0, str(h["unit"].iloc[0]))
fig = go.Figure()
for (machine, label), g in h.groupby(["machine", "params"], sort=True):
    fig.add_trace(go.Scatter(
        x=g["commit_date"], y=g["value"] * scale, mode="lines+markers", name=html.escape(f"{machine}: {label}"),
        text=[html.escape(c[:8]) for c in g["commit"]],
        marker={"symbol": ["x" if s else "circle" for s in g["significant"]], "size": [12 if s else 7 for s in g["significant"]]},
        error_y={"type": "data", "symmetric": False, "array": ((g["ci99_high"] - g["value"]) * scale).fillna(0),
                 "arrayminus": ((g["value"] - g["ci99_low"]) * scale).fillna(0)}))
fig.update_layout(height=460, xaxis_title="commit date", yaxis_title=html.escape(unit), margin={"t": 30})
st.plotly_chart(fig)
st.caption("x markers: significant change against the previous commit. Error bars: asv's 99 % confidence interval.")
table(history)
