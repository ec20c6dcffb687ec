"""What every page shares: the results (fixed at start-up, cached), URL-bound filters, the
problems banner, and the plotly charts. All numbers come from `speedbench.report`.

Safety: the results directory comes from `SPEEDLIB_RESULTS` (set by `speedlib dashboard`
when the server starts) or the repository's `results/`, never from the URL; text from result
files is shown through st.dataframe, st.text, st.code, st.table and Markdown with every such text
escaped (`table_text`, `md_text`: st.table draws its cells as Markdown too), and plotly labels are
HTML-escaped, so nothing from a file is rendered as Markdown or HTML.
"""

from __future__ import annotations

import html
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go
import streamlit as st

from speedbench import report, words
from speedbench.report import age, glance, headline
from speedbench.results import cache
from speedbench.results import problems as problem_text
from speedbench.results.common import printable
from speedbench.results.environment import NoGpuModel
from speedbench.run import plan

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SPEEDLIB_RESULTS") or ROOT / "results").resolve()


# cache_resource, not cache_data: cache_data pickles the frames on every page view (half a
# second at 5000 files); the pages only filter and assign, never change a frame in place.
# Two entries: the tree as it is, and as it was while a view of the old one finishes.
@st.cache_resource(show_spinner="Reading the asv result files...", max_entries=2)
def _load(path: str, signature: str) -> dict:
    loaded = cache.load(path, key=signature)  # a new server reuses the frames parsed by the last one
    # str(): control characters escaped
    return {"measured": loaded.measured, "not_measured": loaded.not_measured,
            "problems": [str(p) for p in loaded.problems if not p.expected],
            # each worded by what happened to it (set aside, skipped, kept and flagged †)
            "set_aside": [problem_text.describe(p) for p in loaded.problems if p.expected],
            "set_aside_summary": problem_text.summary(p for p in loaded.problems if p.expected)}


# A link is a citation: `until` pins the view to the results measured up to that moment, so
# the same link shows the same numbers after new results land. A view opened without it is
# pinned to the newest result there is, and the pin goes into the URL like every filter.
UNTIL = "until"


def _pin(frame: pd.DataFrame, until: pd.Timestamp) -> pd.DataFrame:
    """Rows measured at or before `until` (rows without a run date are kept: asv gave none)."""
    return frame[~(frame["run_date"] > until)] if "run_date" in frame else frame


def results() -> dict:
    # The tree's fingerprint changes whenever an entry under it changes, so new results show
    # without a restart; a short string keeps Streamlit's own hashing of it cheap.
    data = _load(str(RESULTS), cache.fingerprint(RESULTS))
    newest = data["measured"]["run_date"].max() if not data["measured"].empty else pd.NaT
    pin = _link_time(pd.to_datetime(st.query_params.get(UNTIL), utc=True, errors="coerce"))
    if pin is None:  # absent, unreadable or out of range: pin to what there is now
        pin = _link_time(newest, ceil=True)  # the link holds whole seconds: round up, or the newest drops out
    if pin is None:
        return {**data, "newer": 0}
    st.query_params[UNTIL] = pin
    until = pd.Timestamp(pin)  # whole seconds, as the link says
    measured = _pin(data["measured"], until)
    return {**data, "measured": measured, "not_measured": _pin(data["not_measured"], until),
            "newer": len(data["measured"]) - len(measured), "until": until}


def _link_time(t, ceil: bool = False) -> str | None:
    """`t` as a link writes it (whole seconds, UTC), or None where no link can hold it: NaT,
    or a year outside 1-9999 (pandas reads `?until=-1` as the year -1, which strftime cannot
    write, and rounding up a time at the end of pandas' range overflows)."""
    if pd.isna(t):
        return None
    try:
        t = t.ceil("s") if ceil else t
    except (OverflowError, ValueError):  # pandas' OutOfBoundsDatetime is a ValueError
        return None
    return t.strftime("%Y-%m-%dT%H:%M:%SZ") if 1 <= t.year <= 9999 else None


@st.cache_data(max_entries=4)
def _listing(path: str, mtime: float) -> list[str]:  # mtime: a new listing is read afresh
    try:
        return sorted(plan.combinations(Path(path)))
    except (OSError, ValueError, TypeError, AttributeError):  # unreadable or not asv's format
        return []


def suite_listing() -> list[str]:
    """Every benchmark of the suite, from asv's listing in the results directory
    (benchmarks.json, written by each run); empty where there is none or it is unreadable."""
    path = RESULTS / "benchmarks.json"
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return []
    return _listing(str(path), mtime)


def show_problems(data: dict) -> None:
    """Files that were skipped, one line each, behind a warning (never a traceback); results
    of benchmarks changed or removed since are normal history: one line counts them, and
    the list is behind it."""
    problems = data["problems"]
    if problems:
        st.warning(f"{len(problems)} problem(s) while reading the results: the affected files or results "
                   "were skipped.")
        with st.expander("What was skipped, and why"):
            st.text("\n".join(problems))
    if data.get("set_aside"):
        with st.expander(data["set_aside_summary"]):
            st.text("\n".join(data["set_aside"]))
    _show_pin(data)


def _show_pin(data: dict) -> None:
    if "until" not in data:
        return
    st.caption(f"Results measured up to {data['until']:%Y-%m-%d %H:%M:%S} UTC: this link keeps showing "
               "these numbers when new results land.")
    if data["newer"]:
        if st.button(f"Show {data['newer']} newer result(s)", key="_newer"):
            del st.query_params[UNTIL]
            st.rerun()


def require_results(data: dict) -> pd.DataFrame | None:
    """The measured rows, or None after saying clearly why there are none."""
    df = data["measured"]
    if df.empty and data.get("newer"):  # a link pinned before the first result: the button above shows them
        st.info(f"No result was measured up to {data['until']:%Y-%m-%d %H:%M:%S} UTC, the time this link is pinned "
                f"to; the results directory holds {data['newer']} newer one(s): the button above shows them.")
        return None
    if df.empty:
        st.info("No measured results in the results directory below. Produce some with `speedlib run` "
                "(see the README), or start the dashboard on another one with `speedlib dashboard --results DIR`.")
        st.code(str(RESULTS), language=None)
        return None
    return df


def page_data() -> pd.DataFrame:
    """The measured rows, with problems shown; stops the page when there are none."""
    data = results()
    show_problems(data)
    df = require_results(data)
    if df is None:
        st.stop()
    return df


def note_missing_gpu(df: pd.DataFrame) -> None:
    if not (df["gpu"].ne(NoGpuModel.CPU_ONLY) & df["gpu"].ne(NoGpuModel.UNKNOWN)).any():
        st.info("No GPU run is committed yet: every number here comes from a CPU machine. "
                "GPU results appear once `speedlib run` has run on an H100 or H200 and its results/ are committed.")


# Filters are read from the URL and written back to it on every run, defaults included
# (Streamlit's own binding leaves a default out, so a link would change meaning when a new
# default appears). A value the URL names that is not an option is ignored.

def pick(label: str, options: list, key: str, default=None, words=None):
    """A selectbox kept in the URL (`?key=value`), so a link reproduces the view; `words`
    shows an option in words (the URL keeps the identifier)."""
    options = list(options)
    names = [str(o) for o in options]
    wanted = st.query_params.get(key)
    index = names.index(wanted) if wanted in names else options.index(default) if default in options else 0
    shown = (lambda o: f"{words(o)} ({o})" if words(o) != str(o) else str(o)) if words else str
    # A link (the first run of this view: no choice made yet) naming a value these results lack
    # (?machine=h100-typo, ?commit=deadbeef) is a citation gone wrong: another machine's or
    # commit's numbers in its place would be cited as its own. Say so, show nothing until a
    # choice is made, and leave the link as it was.
    broken = wanted is not None and wanted not in names and key not in st.session_state
    if broken:
        # the value comes from the URL: escaped (md_text), so it is shown, never rendered
        st.error(f"This link names {label.split(' (')[0].lower()} '{md_text(wanted)}', which these results do "
                 "not have: "
                 "nothing is shown rather than another one's numbers. Choose one below.")
    value = st.selectbox(label, options, index=None if broken else index, key=key, format_func=shown)
    if value is None and broken:
        st.stop()
    if value is not None:
        st.query_params[key] = str(value)
    return value


def pick_many(label: str, options: list, key: str, default: list | None = None) -> list:
    """A multiselect kept in the URL (`?key=a&key=b`); empty means all, and the URL then
    names every option there is, so that a later option does not join the view. Without a
    choice in the URL, `default` (else all)."""
    options = list(options)
    names = [str(o) for o in options]
    wanted = [options[names.index(w)] for w in st.query_params.get_all(key) if w in names]
    if not wanted and default:
        wanted = [o for o in options if o in default]
    chosen = st.multiselect(label, options, default=[] if len(wanted) == len(options) else wanted, key=key,
                            placeholder="all")
    shown = chosen or options
    st.query_params[key] = [str(o) for o in shown]
    return shown


def tabs(names: list[str], key: str = "tab", default: str | None = None):
    """st.tabs whose open tab is kept in the URL; without one there, `default` (else the first)."""
    wanted = st.query_params.get(key)
    # The default is fixed when the tabs first appear: a default that followed the URL changed
    # with every switch, and Streamlit then dropped every second click on a tab.
    fallback = default if default in names else names[0]
    first = st.session_state.setdefault(f"_{key}_default", wanted if wanted in names else fallback)
    containers = st.tabs(names, key=key, default=first if first in names else names[0], on_change="rerun")
    st.query_params[key] = st.session_state.get(key) or first
    return containers


def say_names(glossary: str) -> None:
    """What the variant and knob names next to it mean (speedbench.words.glossary)."""
    if glossary:
        st.caption("Names: " + glossary)


def esc(values) -> list[str]:
    return [html.escape(str(v)) for v in values]


def config_label(rows: pd.DataFrame) -> pd.Series:
    """A row's configuration without its variant, in the words a chart label needs: its
    benchmark class where the rows span several (they share metric names), and every
    parameter ("AdamStep: resnet50", "densenet_bc, batch=4"), so that no chart pools two
    configurations. A class every row shares is left out: a page of TrainingStep rows labelled
    each box "TrainingStep workload=..." and the labels overlapped."""
    one_class = rows["suite"].nunique() <= 1

    def label(suite, params) -> str:
        parts = ", ".join(p.removeprefix("workload=") for p in report.shared_config(params).split(", ") if p)
        return parts or str(suite) if one_class else f"{suite}: {parts}".rstrip(": ")

    return pd.Series([label(s, p) for s, p in zip(rows["suite"], rows["params"], strict=True)], index=rows.index,
                     dtype=object)


def spread_chart(rows: pd.DataFrame, title: str) -> go.Figure:
    """Every timed sample per variant (box + points), one box per configuration, so the spread is
    visible, not just a bar. Log scale: workloads differ by orders of magnitude."""
    fig = go.Figure()
    scale, unit = (1e3, "ms") if (rows["unit"] == "seconds").all() else (1.0, str(rows["unit"].iloc[0]))
    rows = rows.assign(_config=config_label(rows))
    for variant, g in rows.groupby("variant", sort=True):
        xs, ys = [], []
        for config, samples, value in zip(g["_config"], g["samples"], g["value"], strict=True):
            samples = samples or [value]
            xs += [config] * len(samples)
            ys += [v * scale for v in samples]
        fig.add_trace(go.Box(x=esc(xs), y=ys, name=html.escape(str(variant)), boxpoints="all", jitter=0.3))
    # Ticks written out (plotly's own log ticks read "1000, 5, 2, 100, 5, 2, 10").
    shown = [v * scale for s, v in zip(rows["samples"], rows["value"], strict=True) for v in (s or [v])]
    fig.update_layout(title=html.escape(title), boxmode="group", height=420, margin={"t": 50},
                      yaxis=log_axis(shown, unit))
    return fig


# plotly's own first colours, given to the ratio bars' traces in order (a hollow bar needs its trace's colour)
_PALETTE = plotly.colors.qualitative.Plotly


def ratio_chart(s: pd.DataFrame, y: str, color: str, title: str, axis: str = "x faster than the baseline",
                exact: bool = False) -> go.Figure:
    """Ratios with their interval as error bars, one horizontal bar per row of `s` labelled by
    its `y` column, one colour per `color` value; the dashed line at 1x is the baseline.
    `axis` says what a ratio is; `exact`: counts (bytes), which need no interval, so a bar
    without one is not marked as unsure.

    Horizontal: the labels name a configuration in words ("densenet121, batch=16 / reentrant vs
    none"), and two dozen of them under a vertical chart overlapped diagonally. A label repeated
    within a trace would draw two configurations as one stacked bar (a tuning page once showed
    four knobs' 0.43x-1.29x as one 3.9x bar), so the caller's labels must tell every row apart,
    and a repeat is refused."""
    fig = go.Figure()
    groups = list(s.groupby(color, sort=True))
    for i, (name, g) in enumerate(groups):
        if g[y].duplicated().any():
            raise ValueError(f"chart labels repeat within {name!r}: {sorted(set(g[y][g[y].duplicated()]))}")
        # Each bar grows from the 1x line (right: faster, left: slower), not from the edge of a
        # log axis, where a 0.7x bar would look as long as a win.
        # Hollow, dotted and outlined in its trace's colour: the interval includes 1x, so the bar
        # is not told apart from the baseline (a faded bar read as another machine's lighter colour).
        # Hatched: no interval at all (one value per variant, not paired), so nothing says how
        # sure it is; drawn solid, a single DDP launch looked as certain as 30 paired rounds.
        # Cross-hatched: contended, measured while other work kept the machine busy; shown, never
        # as solid as a clean figure (the tables carry the same mark, ‡, and its counters). A
        # commit whose GPU tests failed there is marked § beside its bar, as in the tables.
        unsure = ((g["ratio_low"] <= 1.0) & (g["ratio_high"] >= 1.0)).tolist()
        lone = [False] * len(g) if exact else (g["ratio_low"].isna() | g["ratio_high"].isna()).tolist()
        busy = report.contended(g).tolist()
        n = g["n"] if "n" in g else pd.Series([math.nan] * len(g), index=g.index)
        ink = _PALETTE[i % len(_PALETTE)]  # set, not left to plotly: a hollow bar is outlined in it
        said = [("contended, not a clean figure; " if b else "")
                + ("interval includes 1x" if u else "single value, no interval" if x else "")
                for u, x, b in zip(unsure, lone, busy, strict=True)]
        fig.add_trace(go.Bar(
            # no bar for a ratio over 0 (`report.UNDEFINED`): it has no length
            y=esc(g[y]), x=g["ratio"].where(np.isfinite(g["ratio"])) - 1.0, base=1.0, orientation="h",
            name=html.escape(str(name)),
            marker={"color": ["white" if u else ink for u in unsure],
                    "line": {"color": ink, "width": [2 if u else 0 for u in unsure]},
                    "pattern": {"shape": ["x" if b else "/" if x else "." if u else ""
                                          for x, b, u in zip(lone, busy, unsure, strict=True)],
                                "fgcolor": [ink if u else "#444" for u in unsure], "solidity": 0.3}},
            # the mark itself beside a contended bar: a faded, hatched bar alone can be hard to see
            text=[" ".join(m for m, on in ((report.CONTENDED, b), (report.GPU_TESTS_FAILED, f)) if on)
                  for b, f in zip(busy, report.gpu_tests_failed(g), strict=True)],
            textposition="outside", cliponaxis=False,
            customdata=list(zip(g["ratio"], [report.fmt_ratio(r, lo, hi).partition(" ")[2] for r, lo, hi in
                                             zip(g["ratio"], g["ratio_low"], g["ratio_high"], strict=True)],
                                ["" if pd.isna(k) else f"N={k:g}" for k in n], said, strict=True)),
            hovertemplate="%{y}: %{customdata[0]:.3g}x %{customdata[1]} %{customdata[2]} %{customdata[3]}"
                          "<extra>%{fullData.name}</extra>",
            error_x={"type": "data", "symmetric": False, "array": (g["ratio_high"] - g["ratio"]).fillna(0),
                     "arrayminus": (g["ratio"] - g["ratio_low"]).fillna(0)}))
    fig.add_vline(x=1.0, line_dash="dash")
    legend = []
    if ((s["ratio_low"] <= 1.0) & (s["ratio_high"] >= 1.0)).any():
        legend.append("hollow dotted bar, outlined in its colour: its 99 % interval includes 1x (not told apart "
                      "from the baseline)")
    if not exact and (s["ratio_low"].isna() | s["ratio_high"].isna()).any():
        legend.append("hatched bar: a single value per variant, no interval (how sure it is is unknown)")
    if report.contended(s).any():
        legend.append(f"cross-hatched bar ({report.CONTENDED}): contended, other work kept the machine busy; "
                      "not a clean figure")
    if report.gpu_tests_failed(s).any():
        legend.append(f"{report.GPU_TESTS_FAILED}: the GPU tests failed on that machine at that commit")
    if legend:
        # Below the axis title: above the bars, the legend's row sits (and the title above it).
        fig.add_annotation(text="<br>".join(legend), xref="paper", yref="paper", x=0, y=0, yanchor="top",
                           yshift=-48, showarrow=False, xanchor="left", align="left")
    # Log scale, so that 0.5x and 2x lie equally far from the 1x line, with ticks at 1-2-5
    # steps written as ratios (plotly's own log ticks read "1, 2, 5, 10, 2, 5, 100").
    values = pd.concat([s["ratio"], s["ratio_low"], s["ratio_high"]]).dropna()
    values = values[(values > 0) & np.isfinite(values)]  # a ratio over 0 has no value and no place on the axis
    low, high = (min(values.min(), 1.0), max(values.max(), 1.0)) if len(values) else (0.5, 2.0)
    # The axis spans the data and a little more, and the ticks are chosen inside that span:
    # plotly hides ticks outside its range, so ticks picked over a wider one left a lone "1x".
    low, high = low / 1.1, high * 1.1
    ticks = ratio_ticks(low, high)
    labels = sorted({html.escape(str(v)) for v in s[y]})
    # A bar slot per label and trace, so that a chart of 24 configurations is as legible as one of 2.
    # showlegend: plotly hides the legend of a single trace, and the trace names the machine:
    # a CPU-only chart beside a CPU-and-GPU one read as GPU results.
    fig.update_layout(title={"text": html.escape(title), "y": 0.99, "yref": "container", "yanchor": "top"},
                      showlegend=True, barmode="group", height=170 + 24 * len(labels) * max(len(groups), 1),
                      margin={"t": 90, "b": 80}, legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0},
                      xaxis={"type": "log", "title": html.escape(f"{axis} (log scale)"), "tickvals": ticks,
                             "ticktext": [f"{t:g}x" for t in ticks], "range": [math.log10(low), math.log10(high)]},
                      # first label on top, as a table reads
                      yaxis={"type": "category", "categoryorder": "array", "categoryarray": labels[::-1],
                             "automargin": True})
    return fig


# Tick steps per decade, coarse to fine: a chart of 0.8x-1.1x gets 0.8, 0.9, 1, 1.1 rather than
# a lone "1x" (its 1-2-5 steps would all fall outside).
_TICK_STEPS = ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 3, 4, 5, 7),
               (1, 1.1, 1.2, 1.3, 1.5, 1.7, 2, 2.5, 3, 4, 5, 6, 7, 8, 9))
# The most of the (log) axis left without a tick at either end: 0.37x-1.44x once got only
# "0.5x, 0.7x, 1x", with three of four bars beyond the last tick, and a 2.6 % bar sat
# below a lowest tick of 5 %.
_UNTICKED_END = 0.15


def _covers(ticks: list[float], low: float, high: float) -> bool:
    span = math.log(high / low)
    return (len(ticks) >= 3 and math.log(ticks[0] / low) <= _UNTICKED_END * span
            and math.log(high / ticks[-1]) <= _UNTICKED_END * span)


def ratio_ticks(low: float, high: float) -> list[float]:
    """Log-axis ticks between `low` and `high`: the coarsest steps that give at least three
    and leave neither end of the axis bare; for a range narrower still (0.97x-1.04x), even
    steps of 0.01, 0.02 or 0.05. Any magnitude: bytes reach 10^10, ratios 10^-3."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)

    def candidates(steps) -> list[float]:
        return [round(m * 10.0 ** e, 6 - e) for e in decades for m in steps if low <= m * 10.0 ** e <= high]

    for steps in _TICK_STEPS:
        ticks = candidates(steps)
        if _covers(ticks, low, high):
            return _both_sides_of_1x(ticks, candidates(_TICK_STEPS[-1]), low, high)
    span = high - low
    if span > 0:  # even steps a quarter of the span or so: 38-42 ms gets 38, 39, ..., 42
        base = 10.0 ** math.floor(math.log10(span / 4))
        for step in (base, 2 * base, 5 * base, 10 * base):
            ticks = [round(k * step, 10) for k in range(math.ceil(low / step), math.floor(high / step) + 1)]
            if 3 <= len(ticks) <= 8:
                return ticks
    return ticks


def _both_sides_of_1x(ticks: list[float], fine: list[float], low: float, high: float) -> list[float]:
    """Where the axis reaches past 1x on both sides (a ratio axis padded by 10 % either way),
    a tick on each: a 0.989x bar once stood left of 1x with its nearest tick at 1x and the
    next at 1.5x. The tick added is the finest step nearest 1x on the bare side."""
    if not (low < 1 / 1.08 and high > 1.08):
        return ticks
    below = [t for t in fine if t < 1]
    above = [t for t in fine if t > 1]
    if below and not any(t < 1 for t in ticks):
        ticks = sorted([*ticks, below[-1]])
    if above and not any(t > 1 for t in ticks):
        ticks = sorted([*ticks, above[0]])
    return ticks


def log_axis(values, title: str) -> dict:
    """A plotly log y-axis over `values` with its ticks written out (plotly's own log ticks
    read "2 3 4 ... 9 100", where the 7 stands for 70)."""
    shown = [v for v in values if v > 0 and math.isfinite(v)]
    if not shown:
        return {"type": "log", "title": html.escape(title)}
    low, high = min(shown) / 1.2, max(shown) * 1.2  # the axis range, so that every tick shows
    ticks = ratio_ticks(low, high)
    return {"type": "log", "title": html.escape(title), "tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks],
            "range": [math.log10(low), math.log10(high)]}


def shown(frame: pd.DataFrame) -> pd.DataFrame:
    """The columns that say something: a parameter no row of this table has (world size on an
    optimizer page) is left out of the view (exports choose their columns in speedbench.report)."""
    empty = [c for c in frame.columns if frame[c].isna().all() or frame[c].astype(str).str.strip().eq("").all()]
    return frame.drop(columns=empty) if len(empty) < len(frame.columns) else frame


# The numbers a reader looks for, moved next to what they compare (variant and baseline):
# after a long benchmark name they sat past the right edge of a laptop screen.
NUMBERS = ("speedup", "memory ratio", "change", "bytes", "baseline bytes", "achieved", "of", "GB/s", "floor GB/s", "N",
           "claimed", "measured")


def on_screen(frame: pd.DataFrame, hide: tuple[str, ...] = ()) -> pd.DataFrame:
    """`frame` as a page shows it: without `hide` and empty columns, the numbers right after the
    variant and baseline (a claim's figures right after the claim), and a benchmark named in
    words within its technique ("FractionOfFloor: gather, % of the pinned host->device copy"
    for "bench_transfer.FractionOfFloor.track_gather_fraction_of_floor"; the page or section
    names the technique). Exports keep every column and full names."""
    frame = shown(frame.drop(columns=[c for c in hide if c in frame]))
    if "benchmark" in frame:  # "FractionOfFloor: write-back, % of the pinned device->host copy"
        frame = frame.assign(benchmark=frame["benchmark"].map(lambda b: words.benchmark(b, technique=False)))
    columns = list(frame.columns)
    numbers = [c for c in NUMBERS if c in columns]
    anchor = next((c for c in ("baseline", "variant", "claim") if c in columns), None)
    if anchor is None or not numbers:
        return frame
    # Where it was measured goes after the numbers: machine, GPU and commit led every row of
    # the overview's tables, and at 1000 px the speedup itself was cut to "1.".
    where = [c for c in WHERE if c in columns and c != anchor]
    rest = [c for c in columns if c not in numbers and c not in where]
    at = rest.index(anchor) + 1
    return frame[rest[:at] + numbers + where + rest[at:]]


WHERE = ("machine", "GPU", "commit")
# Pixels per character of the grid's font, and the widest a column gets (a long note wraps
# nowhere in a grid; past this it is cut, and the full text is in the exports).
_CHAR_PX, _MAX_PX = 7.2, 340
# The grid's room on a 1440-px screen with the sidebar open: the main column is 980 px wide
# and the grid's frame and scrollbar take a few. A grid wider than this scrolls sideways, and
# a reader at 1440 px did not see "why wider than 1.10x" or "baseline value" at all.
FIT_PX = 960


def widths(frame: pd.DataFrame, widths_px: dict[str, int] | None = None) -> dict:
    """A column width per column from its longest text (`widths_px` where already measured):
    Streamlit sized columns from a few rows and cut "bf16_channels_last" to "bf16_channels_"
    further down."""
    return {c: st.column_config.Column(width=w) for c, w in (widths_px or _natural_widths(frame)).items()}


def _natural_widths(frame: pd.DataFrame) -> dict[str, int]:
    def longest(c) -> int:
        return max([len(str(c)), *(len(str(v)) for v in frame[c].tolist())])

    return {c: int(min(_MAX_PX, 22 + _CHAR_PX * longest(c))) for c in frame.columns}


def fits(frame: pd.DataFrame) -> bool:
    """Whether `frame` fits the screen as a grid with every column whole."""
    return _fitting(_natural_widths(frame))


def _fitting(widths_px: dict[str, int]) -> bool:
    # A column at _MAX_PX is already cut: its text needs wrapping, which only a static table does.
    return sum(widths_px.values()) <= FIT_PX and all(w < _MAX_PX for w in widths_px.values())


def show(frame: pd.DataFrame) -> None:
    """`frame` on screen without sideways scrolling: a sortable grid where every column fits
    whole, else a static table whose cells wrap (Streamlit's grid cannot wrap a cell). Both
    show text as text, never as HTML or Markdown."""
    widths_px = _natural_widths(frame)  # one pass over the cells, for the choice and the grid
    if _fitting(widths_px):
        st.dataframe(frame, hide_index=True, column_config=widths(frame, widths_px))
    else:
        # a Styler's hidden index showed anyway: the loader's row numbers, with gaps
        st.table(table_text(frame), hide_index=True)


def table(t: report.Table, hide: tuple[str, ...] = ()) -> None:
    """`t` as a table; `hide`: columns the page already states above it for every row (a
    technique page names its machine and GPU), which would push the numbers off the right."""
    frame = on_screen(t.frame, hide)
    shared = []
    # A machine state every row shares ("not recorded", "quiet: no round disturbed") is said once
    # below the table: as a column it pushed the numbers' explanation past the right edge.
    if "machine state" in frame and len(frame) and frame["machine state"].nunique() == 1:
        shared.append(f"machine state of every row: {frame['machine state'].iloc[0]}")
        frame = frame.drop(columns="machine state")
    show(frame)
    for n in [*shared, *t.notes]:
        caption(n)


def comparison_index(t: report.Table) -> str:
    """speedbench.report.comparisons' lines as a Markdown table, each technique named once and linked
    to its page (a static table wraps, so thirty lines fit 1440 px). Every text from result
    files is escaped (report.md_escape): a variant name cannot become a link or HTML."""
    machines = [c for c in t.frame.columns if c not in ("technique", "page", "comparison")]
    head = ["technique", "comparison", *machines]
    lines = ["| " + " | ".join(report.md_escape(h) for h in head) + " |", "|" + "---|" * len(head)]
    previous = None
    for row in t.frame.to_dict("records"):  # not itertuples: machine columns are no identifiers
        # pages are views/<name>.py, served at ./<name>; the name is a TECHNIQUES key, not file text
        name = f"[{report.md_escape(row['technique'])}](./{row['page']})" if row["page"] != previous else ""
        previous = row["page"]
        cells = [name, report.md_escape(row["comparison"]),
                 *(report.md_escape(str(row[m])) or "not measured" for m in machines)]
        lines.append("| " + " | ".join(cells) + " |")  # report.md_escape escapes "|": no cell adds a column
    return "\n".join(lines)


# Every ASCII punctuation character, which CommonMark lets a backslash escape.
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def md_text(text: str) -> str:
    """`text` for Streamlit's Markdown (captions, alerts, headings): report.md_escape (links,
    images, HTML, code), and what it leaves that Streamlit still draws: $ (LaTeX), ~ (strike
    through), a www. address (a link)."""
    return report.md_escape(text).replace("$", "\\$").replace("~", "\\~").replace("www.", "www\\.")


def table_text(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` for st.table, which draws every cell and header as Markdown (a machine named
    ![t](x.png) became an image in the machines table): every punctuation character of a text
    escaped, so the cell reads exactly as written; numbers stay numbers."""
    def escaped(v):
        return _PUNCTUATION.sub(r"\\\1", printable(v)) if isinstance(v, str) else v

    return frame.map(escaped).rename(columns=lambda c: escaped(str(c)))


def caption(text: str) -> None:
    """A note as a caption, which is Markdown: notes name machines and benchmarks from result
    files, so links, HTML and code are escaped (report.md_escape), and so is a first character
    that would start a heading or a list (">" is already "&gt;", never a quote)."""
    text = md_text(text)
    st.caption("\\" + text if text.startswith(("#", "-", "+", "*")) else text)


@st.cache_data(max_entries=256)
def _behind(commit: str, technique: str) -> age.Behind | None:  # git, twice per commit and technique
    return age.behind(commit, technique, ROOT)


def ages(grid: report.Table, picks: pd.DataFrame) -> dict[tuple[str, str], age.Behind]:
    """How far behind the checkout's HEAD each cell's commit is (speedbench.report.age), by
    (technique, machine); none where the checkout or its git history is missing."""
    commits = dict(zip(grid.sources["result_id"], grid.sources["commit"], strict=True)) \
        if {"result_id", "commit"} <= set(grid.sources.columns) else {}
    out = {}
    for r in picks[picks["status"] == "measured"].itertuples():
        found = _behind(commits[r.result_id], r.technique) if r.result_id in commits else None
        if found is not None:
            out[r.technique, r.machine] = found
    return out


def _age_note(behind: dict) -> str:
    """One line under the chart: how old its figures are, and where the code measured changed since."""
    if not behind:
        return ""
    counts = [b.commits for b in behind.values()]
    changed = sum(b.changed > 0 for b in behind.values())
    span = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)} to {max(counts)}"
    return (f"Age: these figures were measured {span} commits behind this checkout's HEAD; in {changed} of "
            f"{len(behind)} cells speedlib's code for the technique has changed since (hover a cell for its own).")


def glance_chart(grid: report.Table, key: str, technique: str | None = None,
                 df: pd.DataFrame | None = None) -> None:
    """The at-a-glance chart of `grid` (speedbench.report.headline.grid; `technique`: its row
    only), the marks it uses said above it, how old its figures are below it, a click on a
    cell opening its technique's page, and a row of links to the same pages (a touch screen
    has no hover or precise click). `df`: the results it was drawn from, whose other results
    a cell without a number counts (speedbench.report.glance.elsewhere)."""
    picks = headline.pick(grid.data)
    if technique is not None:
        picks = picks[picks["technique"] == technique]
    if picks.empty:
        st.info("No headline result for the selected machines yet.")
        return
    # A phone's column is narrower than the chart's cells can be: there it scrolls sideways (a
    # constant style, nothing from a file; st-key-* is the class Streamlit gives a keyed element).
    st.markdown(f"<style>@media (max-width: {glance.MIN_WIDTH}px) {{ .st-key-glance-{key} {{ overflow-x: auto; }} "
                f".st-key-glance-{key} > div {{ min-width: {glance.MIN_WIDTH}px; }} }}</style>", unsafe_allow_html=True)
    # the marks' meaning above the chart: below it, it fell past the first screen (the dagger is on every H100 cell)
    caption(glance.LEGEND + (f" {glance.CLICK}" if technique is None else ""))
    behind = ages(grid, picks)
    others = glance.elsewhere(df) if df is not None else {}
    event = st.plotly_chart(glance.figure(picks, others=others, ages={k: str(b) for k, b in behind.items()}),
                            key=f"glance-{key}", on_select="rerun", selection_mode="points",
                            config={"displayModeBar": False})
    if _age_note(behind):
        caption(_age_note(behind))
    points = event.selection.points if event and event.selection else []
    clicked = [p.get("customdata") for p in points if p.get("customdata")]
    if technique is None and clicked and clicked[0][0] in report.TECHNIQUES:
        st.switch_page(f"views/{clicked[0][0]}.py")
    if technique is None:
        cols = st.columns(3)  # two rows of three: six in one row cut every title short
        for i, (name, t) in enumerate(report.TECHNIQUES.items()):
            cols[i % 3].page_link(f"views/{name}.py", label=t.title)
