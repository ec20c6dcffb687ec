"""speedlib dashboard: `speedlib dashboard` (or `streamlit run dashboard/app.py`).

Pages are files under pages/ so each is testable on its own (Streamlit AppTest); every
filter is bound to the URL, so a copied link reopens the same view.
"""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pages import _view from here

from speedbench.report import TECHNIQUES  # noqa: E402

st.set_page_config(page_title="speedlib results", layout="wide")

pages = {
    "Results": [
        st.Page("pages/overview.py", title="Overview", default=True),
        st.Page("pages/history.py", title="History across commits"),
        st.Page("pages/machines.py", title="Machine comparison"),
        st.Page("pages/cite.py", title="Cite and export"),
    ],
    "Techniques": [st.Page(f"pages/{name}.py", title=t.title) for name, t in TECHNIQUES.items()],
}
st.navigation(pages).run()
