"""Overview: the at-a-glance chart (one comparison per row, machines across) on the first screen,
its notes folded under it, then every paired comparison and the sources' claims, folded: under
two screens as it opens. What is computed from the results is computed once per tree and view (`cached`)."""

import streamlit as st
from _glance import glance_chart
from _tables import caption, comparison_index, on_screen, table_text
from _technique import page as technique_page
from _view import cached, note_missing_gpu, page, pick_many

from speedbench import report
from speedbench.report import comparisons, headline

st.title("speedlib: which PyTorch speed tricks pay off")
data = page()
df = data["measured"]
with st.sidebar:  # the chart first: the filter would push it below the fold
    machines = pick_many("Machines", sorted(df["machine"].unique()), key="machine")
mine = df[df["machine"].isin(machines)]
# all commits: where a machine's latest result was contended, the grid cites its newest clean one. The
# three tables' names are those `speedlib dashboard` computes ahead (speedbench.report.first_view)
glance = cached(data, "headline", lambda: headline.grid(mine), *machines, rows=mine)
glance_chart(glance, "overview", technique_page)
note_missing_gpu(df)
# the same notes as every export of the grid (`speedlib report --table headline`, the static site), counted alike
with st.expander(f"Notes on the chart ({len(glance.notes)}): baselines, scope, marks, wide intervals"):
    for n in glance.notes:
        caption(n)
st.caption(f"{df['machine'].nunique()} machines, {df['commit'].nunique()} commits, {len(df)} measured values. "
           "Every page's filters live in the URL.")
st.subheader("Every paired comparison (latest commit per machine)")
every = cached(data, "every", lambda: comparisons.every_comparison(mine), *machines, rows=mine)
if every.frame.empty:
    st.info("None of the selected machines has a paired comparison yet.")
else:
    # folded: its forty lines made the page five screens tall; the chart above is the summary
    with st.expander(f"{len(every.frame)} comparisons of {every.frame['technique'].nunique()} techniques, "
                     "each linked to its technique's page"):
        st.markdown(comparison_index(every))
        for n in every.notes:
            caption(n)
st.subheader("Claims of the sources versus measured")
claims = cached(data, "claims", lambda: report.claims_table(mine), *machines, rows=mine)
with st.expander(f"{len(claims.frame)} published figures set beside what the suite measured"):
    # A static table: every cell whole and wrapped (in a grid the comparability and the machine
    # sat past the right edge, so a CPU figure stood beside a GPU claim with no warning in view).
    # how it was measured: in the exports; table_text: st.table draws its cells as Markdown
    st.table(table_text(on_screen(claims.frame, hide=("measured as",))), hide_index=True)
    for n in claims.notes:
        caption(n)
