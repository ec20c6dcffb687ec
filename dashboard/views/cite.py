"""Cite and export: a table as Markdown, CSV or LaTeX with its provenance footer, and BibTeX."""

import streamlit as st

from _view import ROOT, on_screen, page_data, pick, pick_many, widths
from speedbench import report

st.title("Cite and export")
df = page_data()
KINDS = {"paired": "Paired speedup (the headline)", "speedup": "Speedup (time)",
         "memory": "Memory (peak, saved activations, retained bytes)", "floor": "Fraction of the floor",
         "claims": "Claims vs measured"}
c1, c2, c3 = st.columns(3)
with c1:
    kind = pick("Table", list(KINDS), key="table", words=KINDS.get)
with c2:
    machines = pick_many("Machines", sorted(df["machine"].unique()), key="machine")
with c3:
    techniques = pick_many("Techniques", sorted(df["technique"].unique()), key="technique")
commits = pick("Commits", ["latest", "all"], key="commits")
rows = df[df["machine"].isin(machines) & df["technique"].isin(techniques)]
if commits == "latest" and kind != "claims":  # claims pick the latest quiet result themselves (report.citable)
    rows = report.latest(rows)
build = {"paired": report.paired_table, "speedup": report.speedup_table, "memory": report.memory_table, "floor": report.floor_table,
         "claims": report.claims_table}[kind]
t = build(rows)
st.subheader(KINDS[kind])
if t.frame.empty:
    st.info("This selection has no rows for this table (memory is measured on GPU machines only).")
frame = on_screen(t.frame)  # the numbers beside what they compare; the exports keep every column in order
st.dataframe(frame, hide_index=True, column_config=widths(frame))
markdown = report.to_markdown(t)
st.caption("Each export ends with this footer: enough to rerun every number in it. The CSV holds the "
           "numbers themselves (ratio, low, high, value, unit, N, result ID) for pandas or a spreadsheet; "
           "Markdown and LaTeX keep only the columns that differ between rows.")
# Rendered, not shown as source: the footer is Markdown whose escapes (\[, &gt;) are for a
# Markdown reader and read as noise in a code block. Every line was escaped by
# speedbench.report (_md), and st.markdown renders no raw HTML.
with st.container(border=True):
    st.markdown(markdown[markdown.index("\n- ") + 1:] if "\n- " in markdown else markdown)
d1, d2, d3 = st.columns(3)
d1.download_button("Download Markdown", markdown, file_name=f"speedlib-{kind}.md", mime="text/markdown")
d2.download_button("Download CSV", report.to_csv(t), file_name=f"speedlib-{kind}.csv", mime="text/csv")
d3.download_button("Download LaTeX", report.to_latex(t), file_name=f"speedlib-{kind}.tex", mime="application/x-tex")
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
