"""speedlib dashboard: `speedlib dashboard` (or `streamlit run dashboard/app.py`).

Pages are files under views/ so each is testable on its own (Streamlit AppTest), but for the
technique pages: one template (_technique.page) for every record in TECHNIQUES, served at
/<name>. Every filter is kept in the URL, so a copied link reopens the same view. Not pages/:
Streamlit serves a pages/ directory by itself to the first visitor of a deep link on a fresh
server, before app.py sets up the navigation (file names in the sidebar, no wide layout).
"""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the pages import _view, _technique and the rest from here

import _host
import _query
import _tables
import _technique

from speedbench.techniques import TECHNIQUES

st.set_page_config(page_title="speedlib results", layout="wide")
# Before any page runs: a page another site rebinds to this address (its Host header says so),
# and a link no filter could hold, get one line and nothing else.
_asked = st.context.headers.get("Host")
if not _host.host_allowed(_asked):
    st.error(f"This dashboard does not answer to the address '{_tables.md_text(str(_asked)[:80])}' "
             "(another site's name pointed at it?): open it by the address `speedlib dashboard` printed, or start it "
             "with --allow-host NAME for a proxy's name.")
    st.stop()
_query.refuse_unbounded()

pages = {
    "Results": [
        st.Page("views/overview.py", title="Overview", default=True),
        st.Page("views/history.py", title="History across commits"),
        st.Page("views/machines.py", title="Machine comparison"),
        st.Page("views/cite.py", title="Cite and export"),
    ],
    "Techniques": [_technique.page(name) for name in TECHNIQUES],
}
st.navigation(pages).run()
