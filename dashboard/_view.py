"""What every page shares: the results (fixed at start-up, cached), URL-bound filters and the
problems banner; the charts are in speedbench.report.vega, glance and history_chart, the tables and
escaped text in _tables. All numbers come from `speedbench.report`.

Safety: the results directory comes from `SPEEDLIB_RESULTS` (set by `speedlib dashboard`
when the server starts) or the repository's `results/`, never from the URL; text from result
files is shown through st.dataframe, st.text, st.code, st.table and Markdown with every such text
escaped (`_tables.table_text`, `_tables.md_text`: st.table draws its cells as Markdown too),
and every chart is Vega-Lite's, which draws text as SVG text and escapes its tooltips' HTML, so
nothing from a file is rendered as Markdown or HTML.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pandas as pd
import streamlit as st
from _query import refuse_unknown
from _tables import md_text

from speedbench.report import kept
from speedbench.results import cache
from speedbench.results import problems as problem_text
from speedbench.results.environment import NoGpuModel
from speedbench.results.listing import combinations

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
    """The results pinned to the link's `until` (else to the newest result there is), with
    "signature" (the tree's fingerprint) and "until" to key what is computed from them
    (`cached`). A link whose `until` is not a time, or lies before every result, is a citation
    gone wrong: the page says so and stops, rather than show other numbers as its own."""
    # The tree's fingerprint changes whenever an entry under it changes, so new results show
    # without a restart; a short string keeps Streamlit's own hashing of it cheap.
    signature = cache.fingerprint(RESULTS)
    data = _load(str(RESULTS), signature)
    newest = data["measured"]["run_date"].max() if not data["measured"].empty else pd.NaT
    asked = st.query_params.get(UNTIL) or None  # an empty until= pins nothing
    pin = _link_time(pd.to_datetime(asked, utc=True, errors="coerce")) if asked is not None else None
    if asked is not None and pin is None:
        example = _link_time(newest, ceil=True) or "2026-01-31T12:00:00Z"  # the newest result's, as a link writes it
        st.error(f"This link's {UNTIL}= '{md_text(asked)}' is not a time (a link writes one as {example}): nothing "
                 "is shown rather than numbers the link did not pin. Open the page without it for the newest results.")
        st.stop()
    if pin is None:  # absent: pin to what there is now
        pin = _link_time(newest, ceil=True)  # the link holds whole seconds: round up, or the newest drops out
    if pin is None:
        return {**data, "newer": 0, "signature": signature, "until": None}
    st.query_params[UNTIL] = pin
    until = pd.Timestamp(pin)  # whole seconds, as the link says
    measured = _pin(data["measured"], until)
    out = {**data, "measured": measured, "not_measured": _pin(data["not_measured"], until),
           "newer": len(data["measured"]) - len(measured), "until": until, "signature": signature}
    if measured.empty and out["newer"]:
        first = data["measured"]["run_date"].min()
        st.error(f"This link is pinned to {until:%Y-%m-%d %H:%M:%S} UTC ({UNTIL}=), before the first result these "
                 f"results hold ({first:%Y-%m-%d %H:%M:%S} UTC): it shows nothing, since no number was measured by "
                 f"then. Open the page without {UNTIL}= for the newest results.")
        _show_newer(out)
        st.stop()
    return out


# Two entries per table and view at most: what a page computes from the results is the same for
# every reader of the same tree, pin and filters, so it is computed once (a page redrawn for a
# second reader or a widget's rerun only draws). The key is the tree's fingerprint: any change
# under results/ computes afresh.
@st.cache_resource(max_entries=256, show_spinner=False)
def _kept(signature: str, until: str, name: str, key: tuple, _compute):
    return _compute()


def cached(data: dict, name: str, compute, *key, rows: pd.DataFrame | None = None):
    """`compute()`, once per results tree, link pin, `name` and `key` (the filters it depends
    on, as text). The result is shared between readers: callers never change it in place.
    With `rows` (what `compute` reads), it is kept on disk too (speedbench.report.kept), so a
    new server's first view reads it back rather than compute it."""
    if rows is not None:
        compute = functools.partial(kept.table, RESULTS, data["signature"], name, rows, compute)
    return _kept(data["signature"], str(data.get("until")), name, tuple(str(k) for k in key), compute)


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
        return sorted(combinations(Path(path)))
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
    """Files that were skipped, one line each, behind a warning (never a traceback). Results
    of benchmarks changed or removed since are normal history, a maintainer's detail: the
    Machines page lists them (`older_results`)."""
    problems = data["problems"]
    if problems:
        st.warning(f"{len(problems)} problem(s) while reading the results: the affected files or results "
                   "were skipped.")
        with st.expander("What was skipped, and why"):
            st.text("\n".join(problems))
    _show_pin(data)


def older_results(data: dict) -> None:
    """One folded line counting the result files that hold older results, the list behind it."""
    if data.get("set_aside"):
        with st.expander(data["set_aside_summary"]):
            st.text("\n".join(data["set_aside"]))


def _show_pin(data: dict) -> None:
    if data.get("until") is None:
        return
    st.caption(f"Results measured up to {data['until']:%Y-%m-%d %H:%M:%S} UTC: this link keeps showing "
               "these numbers when new results land.")
    _show_newer(data)


def _show_newer(data: dict) -> None:
    if data["newer"]:
        if st.button(f"Show {data['newer']} newer result(s)", key="_newer"):
            del st.query_params[UNTIL]
            st.rerun()


def require_results(data: dict) -> pd.DataFrame | None:
    """The measured rows, or None after saying clearly why there are none."""
    df = data["measured"]
    if df.empty:  # (a link pinned before the first result stopped in `results`)
        st.info("No measured results in the results directory below. Produce some with `speedlib run` "
                "(see the README), or start the dashboard on another one with `speedlib dashboard --results DIR`.")
        st.code(str(RESULTS), language=None)
        return None
    return df


def page() -> dict:
    """`results()`, with problems shown; stops the page when nothing is measured."""
    data = results()
    show_problems(data)
    if require_results(data) is None:
        st.stop()
    return data


def page_data() -> pd.DataFrame:
    """The measured rows, with problems shown; stops the page when there are none."""
    return page()["measured"]


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
    refuse_unknown(label, key, names)  # a link naming values these results lack shows nothing, and says so
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
