"""Tables and text on screen: columns ordered and sized to fit a 1440-px screen, a grid or a static
table, and text from result files escaped for Streamlit's Markdown."""

from __future__ import annotations

import re

import pandas as pd
import streamlit as st

from speedbench import report, words
from speedbench.results.common import printable


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
        # technique pages are served at ./<name> (_technique.page); the name is a TECHNIQUES key, not file text
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
