"""Cite and export: a table as Markdown, CSV (plain data, its provenance beside it) or LaTeX
with its provenance footer, and BibTeX."""

from dataclasses import replace

import streamlit as st
from _footer import export_footer
from _tables import on_screen, show
from _view import ROOT, cached, page, pick, pick_many

from speedbench import report
from speedbench.report import headline

st.title("Cite and export")
data = page()
df = data["measured"]
# The keys are `speedlib report --table` names: the same table either way.
KINDS = {"headline": "Headline grid (the overview's At a glance)",
         "paired": "Paired speedups (every comparison)", "speedup": "Speedup (time)",
         "memory": "Memory (peak, saved activations, retained bytes)", "floor": "Fraction of the floor",
         "claims": "Claims vs measured"}
# In the select box, a few words each: a box a third of 1440 px wide, or a phone's, cut the long
# names ("Headline grid (the overview's At a glance) (headline)"); the heading below says them whole.
SHORT = {"headline": "Headline grid", "paired": "Paired speedups", "speedup": "Speedup (time)", "memory": "Memory",
         "floor": "Fraction of the floor", "claims": "Claims vs measured"}
c1, c2, c3 = st.columns(3)
with c1:
    kind = pick("Table", list(KINDS), key="table", words=SHORT.get)
with c2:
    machines = pick_many("Machines", sorted(df["machine"].unique()), key="machine")
with c3:
    # techniques only: the results also hold the viewer's own timing benchmark ("dashboard")
    techniques = pick_many("Techniques", [t for t in report.TECHNIQUES if t in set(df["technique"])], key="technique")
commits = pick("Commits", ["latest", "all"], key="commits")


def chosen_table():
    rows = df[df["machine"].isin(machines) & df["technique"].isin(techniques)]
    if commits == "latest" and kind not in ("claims", "headline"):  # these pick the latest quiet result themselves
        rows = report.latest(rows)                                   # (report.citable)
    if kind == "headline":  # one row per question: the rows of the techniques left out go, not just their numbers
        t = headline.grid(rows)
        left_out = [report.TECHNIQUES[name].title for name in report.TECHNIQUES if name not in techniques]
        labels = tuple(q.label for q in headline.QUESTIONS if q.technique not in techniques)
        return replace(t, frame=t.frame[~t.frame["technique"].isin(left_out)].reset_index(drop=True),
                       data=t.data[t.data["technique"].isin(techniques)].reset_index(drop=True),
                       notes=[n for n in t.notes if not n.startswith(tuple(f"{x}:" for x in left_out) + labels)])
    return {"paired": report.paired_table, "speedup": report.speedup_table, "memory": report.memory_table,
            "floor": report.floor_table, "claims": report.claims_table}[kind](rows)


# one computation per tree, pin and choice: a download button's rerun only draws
t = cached(data, "cite", chosen_table, kind, commits, *machines, "|", *techniques)
st.subheader(KINDS[kind])
if t.frame.empty:
    st.info("This selection has no rows for this table (memory is measured on GPU machines only).")
frame = on_screen(t.frame)  # the numbers beside what they compare; the exports keep every column in order
show(frame)  # a grid where it fits 1440 px, else a table that wraps
markdown = report.to_markdown(t)
d1, d2, d3, d4 = st.columns(4)
d1.download_button("Download Markdown", markdown, file_name=f"speedlib-{kind}.md", mime="text/markdown")
d2.download_button("Download CSV + provenance (zip)", report.csv_bundle(t, f"speedlib-{kind}"),
                   file_name=f"speedlib-{kind}.zip", mime="application/zip")
d3.download_button("Download CSV (data only)", report.to_csv(t), file_name=f"speedlib-{kind}.csv", mime="text/csv")
d4.download_button("Download LaTeX", report.to_latex(t), file_name=f"speedlib-{kind}.tex", mime="application/x-tex")
lines = len(report.footer_lines(t))
st.caption("Each export carries the footer below: enough to rerun every number in it. Markdown and LaTeX end "
           "with it and keep only the columns that differ between rows. The CSV is plain data, every column, "
           "numbers as numbers (ratio, low, high, value, unit, N, result ID): `pandas.read_csv(path)` or a "
           "spreadsheet opens it as it is; its footer travels beside it, as speedlib-TABLE.provenance.txt in "
           "the zip (`speedlib report --format csv --output X.csv` writes X.provenance.txt).")
# folded under a line that counts it: two dozen notes and a dozen runs' lines made the page eight screens long
with st.expander(f"The footer: {lines} lines of notes, provenance and Reproduce commands"):
    export_footer(t)  # as text: its lines quote the results tree, which Markdown would draw as LaTeX and links
st.subheader("BibTeX")
cff = ROOT / "CITATION.cff"


def cff_problem(line: str) -> None:
    # The line may quote the file: shown as text, never as Markdown.
    st.warning("CITATION.cff gives no BibTeX entry; what is wrong with it:")
    st.text(line)


try:
    st.code(report.bibtex(cff.read_text(encoding="utf-8")), language="bibtex", wrap_lines=True)
except FileNotFoundError:
    st.info(f"No CITATION.cff at {cff}.")
except UnicodeDecodeError as e:  # a ValueError too: caught before the next ones
    cff_problem(f"CITATION.cff is not UTF-8 text (byte {e.start}): save it as UTF-8")
except OSError as e:
    cff_problem(f"CITATION.cff cannot be read: {e.strerror or e}")
except ValueError as e:  # not a citation file: report.bibtex says what is wrong, in one line
    cff_problem(str(e))
