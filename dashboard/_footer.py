"""An export's footer on a page, drawn as text: every line of it may quote a results tree (a GPU
test's id from a planted verdict, a machine's name, a command), and Markdown drew `$...$` in it as
LaTeX and an address as a link whatever the escapes. The exports keep their own formats."""

from __future__ import annotations

import streamlit as st

from speedbench import report


def export_footer(table: report.Table) -> None:
    """The lines the Markdown and LaTeX exports of `table` end with, one text element each."""
    with st.container(border=True):
        for line in report.footer_lines(table):
            st.text(line)
