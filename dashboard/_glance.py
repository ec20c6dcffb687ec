"""The at-a-glance chart on a page (speedbench.report.glance draws it): its legend above it, how
old its figures are below it, and a click on a cell opening the figure clicked: its technique's
page at that machine, commit, baseline and class."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import streamlit as st
from _tables import caption
from _view import ROOT, UNTIL

from speedbench import report
from speedbench.report import age, first_view, glance


@st.cache_data(max_entries=64)
def _behind(grid: pd.DataFrame) -> dict:  # git, a few runs per commit and technique (kept on disk)
    return first_view.cells_behind(grid, ROOT)


def ages(grid: pd.DataFrame, rows: pd.DataFrame) -> dict[tuple[str, str], age.Behind]:
    """How far behind the checkout's HEAD each cell of `rows` (some of `grid`'s) is
    (speedbench.report.age), by (question, machine); none where the checkout or its git history
    is missing. Asked for the whole grid, whichever page draws which rows: one answer to keep."""
    cells = set(zip(rows["question"], rows["machine"], strict=True))
    return {k: b for k, b in _behind(grid).items() if k in cells}


def _age_note(behind: dict) -> str:
    """One line under the chart: how old its figures are, and where the code measured changed since."""
    if not behind:
        return ""
    counts = [b.commits for b in behind.values()]
    changed = sum(b.changed > 0 for b in behind.values())
    span = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)} to {max(counts)}"
    return (f"Age: these figures were measured {span} commits behind this checkout's HEAD; in {changed} of "
            f"{len(behind)} cells speedlib's code for the technique has changed since (hover a cell for its own).")


def cell_link(r, until: str | None = None) -> dict[str, str]:
    """The technique page's filters that show cell `r`'s figure (a tidy row of the grid): its
    machine, and where it has a figure its commit, baseline, class and the tab it is on."""
    link = {"machine": str(r.machine)}
    if isinstance(r.commit, str) and r.commit:
        unit = str(r.unit) if isinstance(r.unit, str) else ""
        link.update(commit=r.commit[:8], baseline=str(r.baseline), suite=str(r.suite),
                    tab="Memory" if r.measure == "peak memory" else "Bandwidth and floor" if unit.startswith("%")
                    else "Time")
    if until:
        link[UNTIL] = until
    return link


# A phone's column is narrower than the chart's cells can be: there the chart scrolls sideways,
# and a line above it says so (constant style and text, nothing from a file; st-key-* is the
# class Streamlit gives a keyed element).
_NARROW = ("<style>@media (max-width: {w}px) {{ .st-key-glance-{key} {{ overflow-x: auto; }} "
           ".st-key-glance-{key} > div {{ min-width: {w}px; }} }} .narrow-{key} {{ display: none; font-size: 14px; "
           "color: #555; }} @media (max-width: {w}px) {{ .narrow-{key} {{ display: block; }} }}</style>"
           '<div class="narrow-{key}">The chart is wider than this screen: it scrolls sideways (swipe it), '
           "{n} machines across.</div>")


def glance_chart(grid: report.Table, key: str, page: Callable[[str], st.Page], technique: str | None = None) -> None:
    """The at-a-glance chart of `grid` (speedbench.report.headline.grid; `technique`: its rows
    only), the marks it uses said above it, how old its figures are below it, a click on a
    cell opening its figure on its technique's page (`page(name)`: _technique.page, passed in
    since that page draws this chart), and a row of links to the technique pages (a touch
    screen has no hover)."""
    rows = grid.data
    if technique is not None:
        rows = rows[rows["technique"] == technique]
    if rows.empty:
        st.info("No headline result for the selected machines yet.")
        return
    st.markdown(_NARROW.format(w=glance.MIN_WIDTH, key=key, n=rows["machine"].nunique()), unsafe_allow_html=True)
    # the marks' meaning above the chart: below it, it fell past the first screen (the dagger is on every H100 cell)
    caption(glance.LEGEND)
    behind = ages(grid.data, rows)
    # Vega-Lite, not plotly: a new tab loads Streamlit's Vega-Lite code in a fraction of plotly.js's 1.5 s
    event = st.vega_lite_chart(None, glance.spec(rows, ages={k: str(b) for k, b in behind.items()}),
                               key=f"glance-{key}", on_select="rerun", selection_mode=glance.SELECTION,
                               width="stretch")
    caption(f"{glance.CLICK} {_age_note(behind)}".strip())
    points = (event.selection.get(glance.SELECTION) or []) if event and event.selection else []
    clicked = [[p[f] for f in glance.SELECTED] for p in points if p.get(glance.SELECTED[0])]
    # A selection outlives the rerun it causes: a click is followed once, or a technique page
    # whose own row was clicked would switch to itself forever.
    if clicked and clicked[0][0] in report.TECHNIQUES and clicked[0] != st.session_state.get(f"_followed-{key}"):
        st.session_state[f"_followed-{key}"] = clicked[0]
        name, machine, question = clicked[0]
        cell = rows[(rows["question"] == question) & (rows["machine"] == machine)]
        if not cell.empty:
            link = cell_link(next(cell.itertuples()), st.query_params.get(UNTIL))
            for k in [*link, "workload", "metric", "_tab_default"]:  # the page's filters start from the link
                st.session_state.pop(k, None)
            st.switch_page(page(name), query_params=link)
    if technique is None:
        cols = st.columns(3)  # two rows of three: six in one row cut every title short
        for i, (name, t) in enumerate(report.TECHNIQUES.items()):
            cols[i % 3].page_link(page(name), label=t.title)
