"""What the dashboard's page tests share (tests/dashboard/, tests/harness/report/test_export_hostile.py):
a page of the app run under Streamlit's AppTest on a results tree, and the tables it shows."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Dataframe, Table
from streamlit.util import calc_hash

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboard" / "app.py"


def open_page(at: AppTest, page: str) -> AppTest:
    """Point `at` (not run yet, so no other page's widgets hold state) at `page`: a file under views/
    ("views/cite.py"), or a technique's address ("/amp"), where dashboard/_technique.page serves it."""
    if not page.startswith("/"):
        return at.switch_page(page)  # a file page: its url_path is its file name
    # AppTest switches only to file pages, and a technique page is one template (a callable) per
    # address: ask for the address's page as a browser's /<name> does, by the hash Streamlit keys
    # a page by (its url_path). Tests check the title drawn, so a Streamlit that stops reading it fails them.
    at._page_hash = calc_hash(page.removeprefix("/"))
    return at


def app_on(results: Path, page: str, monkeypatch, **query) -> AppTest:
    """Run `page` of the app (open_page) on `results` (fixed at start-up, like `speedlib dashboard`)."""
    monkeypatch.setenv("SPEEDLIB_RESULTS", str(results))
    for module in ("_view", "_technique"):  # re-read the start-up setting
        sys.modules.pop(module, None)
    at = open_page(AppTest.from_file(str(APP), default_timeout=60), page)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


# A backslash before ASCII punctuation, as dashboard/_tables.table_text writes it for st.table's Markdown.
_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")


def read(frame: pd.DataFrame) -> pd.DataFrame:
    """A static table as its Markdown reads on screen: every escape undone."""
    def unescaped(v):
        return _ESCAPED.sub(r"\1", v) if isinstance(v, str) else v

    return frame.map(unescaped).rename(columns=lambda c: unescaped(str(c)))


def frames(at: AppTest) -> list[pd.DataFrame]:
    """Every table on the page in page order, grid or static, as a reader sees it: dashboard/_tables.show
    draws a table too wide for 1440 px as a static one (its Markdown escaped), and a test must not
    depend on which it was."""
    return [read(e.value) if isinstance(e, Table) else e.value for e in at.main if isinstance(e, (Dataframe, Table))]


def vega_charts(at: AppTest) -> list[tuple[dict, pd.DataFrame]]:
    """Every Vega-Lite chart on the page: its spec, and its values, which Streamlit moves out of
    the spec into an Arrow table."""
    import pyarrow as pa  # noqa: PLC0415 - Streamlit's own dependency, needed here alone

    return [(json.loads(e.proto.spec), pa.ipc.open_stream(e.proto.data.data).read_pandas())
            for e in at.get("vega_lite_chart")]


def glance_cells(at: AppTest) -> pd.DataFrame:
    """The at-a-glance chart's cells as the page sent them (speedbench.report.glance.spec: one row
    per question and machine)."""
    (cells,) = [values for spec, values in vega_charts(at) if "technique" in values]
    return cells


def cell_text(cell) -> str:
    """A glance cell's text as read on screen, line by line: each line is in one of three marks
    (bold, plain, italic), a zero-width space in the other two."""
    lines = zip(*(str(getattr(cell, f)).split("\n") for f in ("bold", "plain", "italic")), strict=True)
    return " ".join(t for t in ("".join(piece.strip("\u200b") for piece in line) for line in lines) if t)
