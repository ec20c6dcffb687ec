"""Exports of a `Table`: Markdown, CSV and LaTeX with a provenance footer; BibTeX from CITATION.cff.

Each export carries a provenance footer (per run: the result IDs, commit, machine, GPU,
driver, CUDA, torch, statistic and N, date, and the command that reproduces the measurement).
Markdown and LaTeX hold it below the table; the CSV is plain data (a header and the rows,
numbers as numbers, so `pandas.read_csv(path)` and a spreadsheet read it as it is), and its
provenance travels beside it as text (`csv_provenance`: the CLI writes `X.provenance.txt`
next to `X.csv`, the dashboard offers both in one zip, `csv_bundle`).
Names in them come from result files, so each format escapes every cell, the title and the
footer for its reader: control characters as escapes everywhere, spreadsheet formulas
neutralised in CSV, HTML and link syntax in Markdown, every special character in LaTeX. No
Streamlit import: the dashboard and the `speedlib report` command share this module.
"""

from __future__ import annotations

import io
import math
import re
import shlex
import urllib.parse
import zipfile
from pathlib import Path

import pandas as pd

import speedlib
from speedbench.report.marks import CONTENDED, GPU_TESTS_FAILED, contended, earlier_version
from speedbench.report.rows import Table
from speedbench.results import gpu_tests as gpu_verdicts
from speedbench.results.load import is_commit, printable  # the loader's rule: one home for what a hash is
from speedbench.stats import contention

__all__ = ["provenance", "reproduce_command", "is_commit", "to_markdown", "to_csv", "csv_provenance",
           "provenance_path", "csv_bundle", "to_latex", "bibtex", "footer_lines", "NO_ROWS"]

# --- provenance and exports --------------------------------------------------------------

# The install step holds nothing from a file, so it stays as the docs and goldens spell it.
_INSTALL = 'python3 -m pip install -e ".[bench]"'


def _not_a_commit(commit) -> str:
    """Why a run with `commit` gets no command that reruns it, in one line."""
    return (f"no Reproduce line for the run of commit '{printable(commit)}': it is not a commit hash (7 to 64 hex "
            "digits), so a command that checks it out could run something else; the result file's commit_hash "
            "needs fixing")


def reproduce_command(commit: str, benchmarks: list[str], quiet: bool = False) -> str:
    """The command that reruns these benchmarks with the library and suite of `commit`;
    `quiet`: they were measured on a contended machine, so the rerun waits for a quiet one.
    Names come from result files: every word is shell-quoted (shlex), so a pasted command
    runs git, pip and speedlib with exactly these arguments; ValueError for a commit that
    is not a hash."""
    if not is_commit(commit):
        raise ValueError(_not_a_commit(commit))
    if not benchmarks:  # '^()' would match every benchmark: a whole-suite rerun, not this one
        raise ValueError("a reproduce command needs the benchmarks it reruns; none were given")
    names = "|".join(re.escape(b) for b in sorted(set(benchmarks)))
    wait = ["--wait-quiet", "600", "--require-quiet"] if quiet else []
    return " && ".join([shlex.join(["git", "checkout", commit]), _INSTALL,
                        shlex.join(["speedlib", "run", *wait, "--bench", f"^({names})"])])


def _statistic(kinds: set[str], n: pd.Series) -> str:
    """How the rows' numbers were obtained, in words, and their N."""
    said = {"time": "median of timed samples (asv)",
            "paired speedup": "Hodges-Lehmann estimate of per-round ratios, variants taking turns in one process "
                              "(N: rounds)"}
    parts = [said[k] for k in ("paired speedup", "time") if k in kinds]
    if kinds - said.keys():
        parts.append("single value per run (asv track)")
    stat = "; ".join(parts)
    low, high = int(n.min()), int(n.max())
    return f"{stat}; N = {low}" if low == high else f"{stat}; N = {low}-{high}"


def provenance(sources: pd.DataFrame) -> list[dict[str, str]]:
    """One entry per run the table draws on (a result file, and the environment record of the
    `speedlib run` that measured its rows), naming the result IDs of its rows and of their
    baselines (`result_id_base`), with what it takes to rerun them. A file that runs added to
    at different times gives one entry per run, each with its own environment."""
    entries = []
    if sources.empty:
        return entries
    for _, rows in sources.groupby(["file", "recorded_at"], sort=False, dropna=False):
        r = rows.iloc[0].map(lambda v: None if not isinstance(v, list) and pd.isna(v) else v)
        gpu = r.get("gpu_model") or f"none (CPU: {r.get('cpu_model') or 'unknown'})"
        ids = pd.concat([rows[c] for c in ("result_id", "result_id_base") if c in rows]).dropna()
        entries.append({
            "results": " ".join(sorted(set(ids))),
            "commit": r["commit"],
            "commit date": r["commit_date"].strftime("%Y-%m-%d") if r["commit_date"] is not None else "unknown",
            "machine": r["machine"],
            "GPU": gpu,
            "driver": r.get("driver") or "n/a",
            "CUDA": f"{r['cuda']} (torch build)" if r.get("cuda") else "n/a",
            "torch": r.get("torch") or "unknown",
            **({"torch threads": f"{r['torch_threads']:g}"} if isinstance(r.get("torch_threads"), (int, float))
               else {}),
            "statistic": _statistic(set(rows["kind"]), rows["n"]),
            "measured": str(r.get("recorded_at")
                            or (r["run_date"].isoformat() if r["run_date"] is not None else "unknown")),
            **({"benchmark code": "an earlier version, changed since (the command below reruns that version)"}
               if earlier_version(rows).any() else {}),
            "machine state": run_state(rows),
            # the commit's GPU tests on that machine (speedlib slot); nothing to say on a CPU machine
            **({"GPU tests": (f"{GPU_TESTS_FAILED} " if r["gpu_tests"] == gpu_verdicts.FAILED else "")
                + (r.get("gpu_tests_note") or r["gpu_tests"])}
               if r.get("gpu_tests") not in (None, gpu_verdicts.NOT_APPLICABLE) else {}),
            # None: the commit is no hash, and the footer says so instead (`_footer_lines`)
            "command": reproduce_command(r["commit"], list(rows["benchmark"]), quiet=bool(contended(rows).any()))
            if is_commit(r["commit"]) else None,
        })
    return sorted(entries, key=lambda e: (e["machine"], e["commit date"], e["commit"], e["measured"]))


# Exact counts (bytes of memory): interference cannot change them, so no counters are kept for
# them; "not recorded (measured before speedlib recorded it)" said of a 2026-11-28 run's peak
# memory read as an old run. Their rows are told apart by their kind.
EXACT_STATE = "exact counts: interference does not change them"


def run_state(rows: pd.DataFrame) -> str:
    """What the interference counters of one run's rows said, for its provenance line; exact
    counts (memory) need none and are said so, and leave the timed rows' verdict to the rest."""
    exact = rows["kind"].eq("memory") if "kind" in rows else pd.Series(False, index=rows.index)
    if exact.all() and len(rows):
        return EXACT_STATE
    rows = rows[~exact]
    states = rows["contention"].fillna("").value_counts() if "contention" in rows else pd.Series(dtype=int)
    busy = int(states.get(contention.CONTENDED, 0))
    if busy:
        return f"{CONTENDED} contended in {busy} of {len(rows)} results (not clean figures: see the notes)"
    left_out = int(rows["dropped"].sum()) if "dropped" in rows else 0
    if states.get(contention.DROPPED, 0):
        return f"quiet but for disturbed rounds, left out ({left_out} in all)" if left_out else \
            "quiet but for a few disturbed rounds"
    if states.get(contention.CLEAN, 0) == len(rows):
        return "quiet (interference counters recorded, no round disturbed)"
    return "interference not recorded (measured before speedlib recorded it)" if not states.get(contention.CLEAN) \
        else "quiet where recorded"


def _footer_lines(table: Table, shared: list[str] = ()) -> list[str]:
    lines = [f"Note: {n}" for n in [*shared, *table.notes]]
    entries = provenance(table.sources)
    if not entries:
        lines.append("Provenance: no measured results in this table.")
    for e in entries:
        lines.append("Provenance: " + ", ".join(f"{k} {v}" for k, v in e.items() if k != "command"))
        lines.append(f"Reproduce: {e['command']}" if e["command"] else f"Note: {_not_a_commit(e['commit'])}")
    lines.append(f"Exported by speedlib {speedlib.__version__}; cite with CITATION.cff and the lines above.")
    return lines


def footer_lines(table: Table) -> list[str]:
    """The footer the Markdown and LaTeX exports of `table` end with, as plain lines (not yet
    escaped for either): for a page that draws it as text."""
    return [printable(line) for line in _footer_lines(table, _informative(table)[1])]


def _informative(table: Table) -> tuple[pd.DataFrame, list[str]]:
    """The columns of `table.frame` that tell rows apart, and a footer line naming the values
    every row shares ("all rows: machine h100-sxm-80gb, commit bdb0cb6d"). Empty columns are
    dropped. This is what a reader of Markdown or LaTeX needs, and it keeps a table inside a
    page; the CSV keeps every column for scripts."""
    frame = table.frame
    if len(frame) < 2:
        return frame.loc[:, [c for c in frame.columns if frame[c].map(_filled).any()]], []
    keep, shared = [], []
    for column in frame.columns:
        values = frame[column]
        if not values.map(_filled).any():
            continue
        if values.map(_filled).all() and values.astype(str).nunique() == 1:
            shared.append(f"{column} {printable(values.iloc[0])}")
        else:
            keep.append(column)
    return frame.loc[:, keep], ([f"all rows: {', '.join(shared)}"] if shared else [])


def _filled(value) -> bool:
    return not (value is None or value == "" or (isinstance(value, float) and math.isnan(value)))


def _cells(frame: pd.DataFrame) -> list[list[str]]:
    """Header and rows as text, every control character written as its escape (`printable`):
    names come from result files, and a newline in one must not start a row, a footer line
    or a LaTeX paragraph of its own in any export."""
    return [[printable(c) for c in frame.columns]] + [["" if pd.isna(v) else printable(v) for v in row]
                                                     for row in frame.itertuples(index=False)]


# Markdown: backslash first (so the escapes added below cannot be cancelled by one from a
# file), the pipe that ends a cell, backticks that open code, the brackets of link, image
# and reference syntax; HTML's <, > and & as entities, so no tag, autolink or entity is
# read from a file.
_MARKDOWN = {"\\": "\\\\", "|": "\\|", "`": "\\`", "[": "\\[", "]": "\\]", "<": "&lt;", ">": "&gt;", "&": "&amp;",
             "*": "\\*"}
_MARKDOWN_RE = re.compile("|".join(re.escape(k) for k in _MARKDOWN))


def md_escape(text: str) -> str:
    return _MARKDOWN_RE.sub(lambda m: _MARKDOWN[m.group()], printable(text))


def md_code(text: str) -> str:
    """`text` as one code span: its fence is longer than any run of backticks inside it, so
    a benchmark name cannot close the span early (nothing in a code span is Markdown or HTML)."""
    text = printable(text)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# What an export of a table without rows says in place of the table.
NO_ROWS = "No rows: this table is empty."


def to_markdown(table: Table) -> str:
    """A GitHub-flavoured Markdown table under a `##` title, the footer as a list. Every cell,
    the title and each footer line are escaped (`md_escape`); the reproduce command is a code span."""
    frame, shared = _informative(table)
    rows = [[md_escape(c) for c in row] for row in _cells(frame)]
    out = [f"## {md_escape(table.title)}", ""]
    if frame.empty:  # no row (or no column): a header of no cells is no Markdown table
        out.append(NO_ROWS)
    else:
        out += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    out.append("")
    for line in _footer_lines(table, shared):
        kind, _, text = line.partition(": ")
        out.append(f"- {kind}: {md_code(text)}" if kind == "Reproduce" else f"- {md_escape(line)}")
    return "\n".join(out) + "\n"


# CSV injection (OWASP): a spreadsheet runs a cell that starts with one of these as a
# formula, so such a cell gets a leading single quote. A cell that is only a signed number,
# with or without a percent sign ("-0.6%", "+1.6 %", "-3.2"), is left as it is: it calls and
# references nothing, and quoting it would turn every negative change into text for the
# reader. Tab and carriage return, also on OWASP's list, never start a cell: `_cells`
# writes them as escapes.
_FORMULA_START = ("=", "+", "-", "@")
_SIGNED_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s?%?")


def _csv_cell(text: str) -> str:
    if text.startswith(_FORMULA_START) and not _SIGNED_NUMBER.fullmatch(text):
        return "'" + text
    return text


def _csv_field(text: str) -> str:
    """The csv module's minimal quoting, and also for a '#': a reader told comment='#' would
    drop the rest of an unquoted one's row (quoted, pandas keeps it)."""
    if any(c in text for c in ',"#\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def to_csv(table: Table) -> str:
    """The table's numbers (`Table.data`: ratio, low, high, value, unit, N, result ID, every
    column kept) as plain data: a header and one line per row, nothing else, so
    `pandas.read_csv(path)` with no options gives numbers for the numeric columns and a
    spreadsheet opens it as a table. Its provenance footer is `csv_provenance`, kept beside
    it. Cells that a spreadsheet would run as formulas are neutralised (`_csv_cell`)."""
    frame = table.frame if table.data is None else table.data
    rows = [[_csv_field(_csv_cell(c)) for c in row] for row in _cells(frame)]
    return "".join(",".join(row) + "\n" for row in rows)


def csv_provenance(table: Table) -> str:
    """The footer that goes with `to_csv(table)`, as plain text, one line each (Note:,
    Provenance:, Reproduce:, Exported by): the commits, machines, run dates and the command
    that reruns every number in the CSV. Control characters are written as escapes."""
    lines = [f"Provenance of the CSV export '{printable(table.title)}' (speedlib; the CSV holds the data only):", ""]
    return "\n".join(lines + [printable(line) for line in _footer_lines(table)]) + "\n"


def provenance_path(csv_path: str | Path) -> Path:
    """Where the provenance of the CSV at `csv_path` is written: X.csv -> X.provenance.txt."""
    path = Path(csv_path)
    return path.with_name((path.stem if path.suffix.lower() == ".csv" else path.name) + ".provenance.txt")


def csv_bundle(table: Table, name: str) -> bytes:
    """A zip of `name`.csv (`to_csv`) and `name`.provenance.txt (`csv_provenance`), for a
    download that keeps the two together."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for member, text in ((f"{name}.csv", to_csv(table)),
                             (provenance_path(f"{name}.csv").name, csv_provenance(table))):
            # a fixed date: the same table gives the same bytes
            z.writestr(zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0)), text, zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


# < > | print as other glyphs in LaTeX's default font encoding, so they are named.
_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
          "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
          "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}
_LATEX_RE = re.compile("|".join(re.escape(k) for k in _LATEX))


def _tex(text: str) -> str:
    """`text` as LaTeX that prints it: specials escaped, control characters (a newline, a
    blank line that would end the paragraph) as escapes. A leading `[` is braced: after the
    previous row's `\\` it would be read as that command's optional spacing argument."""
    text = _LATEX_RE.sub(lambda m: _LATEX[m.group()], printable(text))
    return "{}" + text if text.startswith("[") else text


def to_latex(table: Table) -> str:
    """A plain `table` environment (no package needed) with the footer in small print."""
    frame, shared = _informative(table)
    rows = _cells(frame)
    out = [f"% speedlib export: {printable(table.title)}", r"\begin{table}[ht]", r"\centering", r"\footnotesize"]
    if frame.empty:  # a tabular of no columns does not compile
        out.append(NO_ROWS + r"\par")
    else:
        out += [r"\begin{tabular}{" + "l" * len(rows[0]) + "}", r"\hline",
                " & ".join(_tex(c) for c in rows[0]) + r" \\", r"\hline"]
        out += [" & ".join(_tex(c) for c in r) + r" \\" for r in rows[1:]]
        out += [r"\hline", r"\end{tabular}"]
    out += [f"\\caption{{{_tex(table.title)}}}", r"\par\scriptsize"]
    out += [_tex(line) + r"\\" for line in _footer_lines(table, shared)]
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def bibtex(cff_text: str) -> str:
    """A BibTeX @software entry from the text of CITATION.cff (yaml.safe_load: no code runs).

    Every value is made literal (`_bib`, `_bib_url`): a title in the file cannot close its
    field, add a field or an entry, or run a TeX command. ValueError, in one line, for a file
    that is not a CITATION.cff (not YAML, tagged objects, a list where text belongs)."""
    meta = _citation(cff_text)

    def text(key: str) -> str:
        return _cff_text(meta.get(key), key)

    names = [_bib_author(a) for a in _cff_list(meta, "authors")]
    year = re.match(r"\d{4}", text("date-released"))
    # CFF allows one SPDX identifier or a list of them, any of which applies
    licenses = meta["license"] if isinstance(meta.get("license"), list) else [meta.get("license")]
    fields = {"author": " and ".join(names), "title": _bib(text("title")), "version": _bib(text("version")),
              "year": year.group() if year else "", "url": _bib_url(text("repository-code") or text("url")),
              "license": _bib(" or ".join(t for t in (_cff_text(x, "license") for x in licenses) if t)),
              "note": _bib(text("message"))}
    key = f"speedlib{fields['year']}"
    body = ",\n".join(f"  {k} = {{{v}}}" for k, v in fields.items() if v)
    return f"@software{{{key},\n{body}\n}}\n"


def _citation(cff_text: str) -> dict:
    """CITATION.cff's top-level mapping; ValueError in one line where it is none."""
    import yaml  # noqa: PLC0415 - only the dashboard needs it

    try:
        meta = yaml.safe_load(cff_text)
    except yaml.constructor.ConstructorError as e:  # !!python/object and the like: safe_load refuses them
        if "unhashable" in str(e.problem):  # `? [a, b]`: a list or mapping used as a field's name
            raise ValueError(f"CITATION.cff{_yaml_where(e)} uses a list or mapping as a field's name: fix the "
                             "file") from None
        raise ValueError(f"CITATION.cff{_yaml_where(e)} holds a YAML tag that is not plain data "
                         f"({printable(str(e.problem))[:120]}): remove it") from None
    except ValueError as e:  # a value YAML reads as a date that is none (date-released: 2026-13-45)
        raise ValueError(f"CITATION.cff holds a date that is no date ({printable(str(e))[:120]}): write it as "
                         "YYYY-MM-DD") from None
    except yaml.YAMLError as e:
        said = ", ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
        raise ValueError(f"CITATION.cff is not valid YAML{_yaml_where(e)}: {printable(said)[:120]}; fix the file") \
            from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ValueError("CITATION.cff nests too deeply to be read: it is not a citation file; fix it") from None
    if meta is None:  # an empty file would give an entry with no field at all
        raise ValueError("CITATION.cff is empty: it needs at least title: and authors:; fix the file")
    if not isinstance(meta, dict):
        raise ValueError(f"CITATION.cff holds {_yaml_kind(meta)}, not a mapping of fields (title:, authors:, ...): "
                         "fix the file")
    return meta


def _yaml_where(error) -> str:
    mark = getattr(error, "problem_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def _yaml_kind(value) -> str:
    return {list: "a list", dict: "a mapping", str: "text", int: "a number", float: "a number",
            bool: "true or false"}.get(type(value), f"a {type(value).__name__}")


def _cff_text(value, key: str) -> str:
    """The value of field `key` as text ("" where absent): a date or a number is text too, a
    list or a mapping is a ValueError, in one line."""
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        raise ValueError(f"CITATION.cff: '{key}' is {_yaml_kind(value)}, where text belongs: fix the file")
    return str(value)


def _cff_list(meta: dict, key: str) -> list:
    value = meta.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"CITATION.cff: '{key}' is {_yaml_kind(value)}, where a list belongs: fix the file")
    return value


def _bib_author(author) -> str:
    """One author as BibTeX names them: an organisation braced whole (else BibTeX would split
    it into first and last names), a person as "family, given"."""
    if not isinstance(author, dict):
        raise ValueError(f"CITATION.cff: an author is {_yaml_kind(author)}, where a mapping (name: or family-names:, "
                         "given-names:) belongs: fix the file")
    if _cff_text(author.get("name"), "name"):
        return "{" + _bib(_cff_text(author["name"], "name")) + "}"
    parts = [_bib_name_part(_cff_text(author.get(k), k)) for k in ("family-names", "given-names")]
    return ", ".join(p for p in parts if p)


def _bib_name_part(text: str) -> str:
    """A family or given name, braced where BibTeX would otherwise split it: at a comma, or at
    the word 'and' (which separates authors)."""
    text = _bib(text)
    return "{" + text + "}" if re.search(r",|\band\b", text, re.IGNORECASE) else text


# LaTeX's specials, as for tables (`_tex`), but braces as commands: BibTeX matches every
# brace of a field, escaped or not, so a `\}` from a file would still close the field.
_BIBTEX = {**_LATEX, "{": r"\textbraceleft{}", "}": r"\textbraceright{}"}
_BIBTEX_RE = re.compile("|".join(re.escape(k) for k in _BIBTEX))


def _bib(text: str) -> str:
    """`text` as a BibTeX field value that prints it: control characters as escapes (a blank
    line would end the paragraph), every special character and brace as a command."""
    return _BIBTEX_RE.sub(lambda m: _BIBTEX[m.group()], printable(text))


def _bib_url(url: str) -> str:
    """A URL, read verbatim by biblatex: characters a URL cannot hold (braces, backslash,
    spaces, quotes, control characters) percent-encoded, so it neither closes its field nor
    reads as a command."""
    return urllib.parse.quote(url, safe=":/?#[]@!$&'()*+,;=%~-._")
