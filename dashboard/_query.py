"""A link's query values, bounded and checked before a page does any work: a value longer than any
option, too many values, or a value a multiselect does not offer is said in one line, and the page
shows nothing misleading. (A 100,000-character `?machine=` was echoed whole in an error box a
thousand screens long; `?machine=h100-typo` on the Cite page silently showed every machine.)"""

from __future__ import annotations

import streamlit as st
from _tables import md_text

# The longest value a link holds: a machine name is at most 100 characters (speedlib run
# --machine), a commit 64, a benchmark's parameters a few hundred (200 per value).
MAX_VALUE = 2000
MAX_VALUES = 200  # of one key: a multiselect of every machine or parameter set there is
MAX_KEYS = 30  # a page keeps a dozen filters in its link
_SHOWN = 40  # characters of a refused value the message quotes


def _quoted(value: str) -> str:
    return md_text(value if len(value) <= _SHOWN else f"{value[:_SHOWN]}...")


def refuse_unbounded() -> None:
    """Stop the page, with one line, where the link holds more than any page's filters take.
    Called before the navigation runs a page: nothing is loaded or drawn for such a link."""
    keys = list(st.query_params.keys())
    why = None
    if len(keys) > MAX_KEYS:
        why = f"holds {len(keys)} filters, more than the {MAX_KEYS} a page keeps"
    for key in keys[:MAX_KEYS + 1]:
        values = st.query_params.get_all(key)
        if why is None and len(values) > MAX_VALUES:
            why = f"names {len(values):,} values of {_quoted(key)}, more than the {MAX_VALUES} a filter takes"
        long = next((v for v in values if len(v) > MAX_VALUE), None)
        if why is None and long is not None:
            why = (f"gives {_quoted(key)} a value {len(long):,} characters long ('{_quoted(long)}'), longer than any "
                   f"name a filter takes ({MAX_VALUE:,})")
        if why is None and len(key) > MAX_VALUE:
            why = f"has a filter name {len(key):,} characters long"
    if why is not None:
        st.error(f"This link {why}: nothing is shown. Open the page from the menu, or fix the link.")
        st.stop()


def refuse_unknown(label: str, key: str, names: list[str]) -> None:
    """Where the link (the first run of this view: no choice made yet) names values of a
    multiselect that these results do not have, say which and stop: filling in every option, or
    the others alone, would cite another selection's numbers as the link's. A button drops them."""
    if key in st.session_state:
        return
    unknown = [v for v in st.query_params.get_all(key) if v not in names]
    if not unknown:
        return
    what = label.split(" (")[0].lower()
    shown = ", ".join(f"'{_quoted(v)}'" for v in unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3
                                                               else "")
    st.error(f"This link names {what} {shown}, which these results do not have: nothing is shown rather than "
             "another selection's numbers.")
    if st.button(f"Drop {'it' if len(unknown) == 1 else 'them'} from the link", key=f"_drop_{key}"):
        st.query_params[key] = [v for v in st.query_params.get_all(key) if v in names]
        st.rerun()
    st.stop()
