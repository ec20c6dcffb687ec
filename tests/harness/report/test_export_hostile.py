"""Exports, the report and the dashboard on hostile data: nothing in a result file, a
CITATION.cff or a URL makes a printed command run something else, adds a BibTeX entry, or
crashes a table, a page or `speedlib report`.

Each test here reproduces a way that once went wrong: a commit hash that was a shell command
in the `Reproduce:` line, a benchmark name whose quote ended the `--bench '...'` argument, a
CITATION.cff title that closed its BibTeX field (or a CITATION.cff that was no mapping), a
0-byte value divided by, two result files of one commit, `?until=-1`, machine names written
raw into docs/results.md, an empty table, names from result files read as Markdown on a page.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from speedbench import report
from speedbench.cli import parser as cli
from speedbench.report import headline, writeup
from speedbench.results import synthetic
from speedbench.results.load import load_results, printable

ROOT = Path(__file__).resolve().parents[3]
TIME = "bench_contiguous.OptimizerStep.time_adam_step"
RETAINED = "bench_tuning.RetainedGraph.track_retained_bytes"  # its `on` variant retains 0 bytes
# report.bibtex reads CITATION.cff with PyYAML, which comes with the dashboard extra.
needs_yaml = pytest.mark.skipif(importlib.util.find_spec("yaml") is None,
                                reason="PyYAML is not installed (pip install -e '.[dashboard]'): BibTeX needs it")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("results")
    synthetic.write_results(tree, commits=3, machines=2)
    return tree


@pytest.fixture(scope="module")
def df(tree) -> pd.DataFrame:
    return load_results(tree).measured


def _sources(df: pd.DataFrame, commit: str | None = None, names: list[str] | None = None) -> pd.DataFrame:
    """Rows of one run (one provenance entry) with a commit and benchmark names from a file."""
    rows = df[(df["machine"] == "synthetic-h100") & (df["commit"] == df["commit"].iloc[0])].head(2)
    return rows.assign(commit=rows["commit"].iloc[0] if commit is None else commit,
                       benchmark=names or list(rows["benchmark"]))


def _table(sources: pd.DataFrame) -> report.Table:
    return report.Table("t", pd.DataFrame({"a": ["x", "y"]}), sources)


def _reproduce_lines(table: report.Table) -> list[str]:
    """The commands the exports print to paste: the CSV's footer and the Markdown's code spans."""
    csv = [line.removeprefix("Reproduce: ") for line in report.csv_provenance(table).splitlines()
           if line.startswith("Reproduce: ")]
    markdown = []
    for line in report.to_markdown(table).splitlines():
        if line.startswith("- Reproduce: "):
            span = line.removeprefix("- Reproduce: ")
            fence = re.match("`+", span).group()
            markdown.append(span[len(fence):-len(fence)].strip(" "))
    assert csv == markdown  # one command, whatever the format
    return csv


# --- case 1: the Reproduce line runs what it says and nothing else ------------------------

HOSTILE_COMMITS = ["abc1234;touch${IFS}MARK;#", "abc1234 && touch MARK", "$(touch MARK)", "`touch MARK`",
                   "abc1234\ntouch MARK", "-c core.pager=touch MARK", "abc123", "g" * 40, "a" * 65, ""]


@pytest.mark.parametrize("commit", HOSTILE_COMMITS)
def test_a_commit_that_is_not_a_hash_gets_no_reproduce_line_but_a_note(df, tmp_path, commit):
    commit = commit.replace("MARK", str(tmp_path / "mark"))
    table = _table(_sources(df, commit=commit))
    assert _reproduce_lines(table) == []
    assert "git checkout" not in report.to_csv(table)
    for text in (report.to_markdown(table), report.csv_provenance(table), report.to_latex(table)):
        assert "git checkout" not in text
        notes = [line for line in text.splitlines() if "not a commit hash" in line]
        assert len(notes) == 1 and "7 to 64 hex digits" in notes[0]
    (entry,) = report.provenance(table.sources)
    assert entry["command"] is None
    with pytest.raises(ValueError, match="not a commit hash"):
        report.reproduce_command(commit, [TIME])


HOSTILE_NAMES = ["bench_x.S.time_a';touch MARK;'", "bench_x.S.time_a$(touch MARK)", "bench_x.S.time_a`touch MARK`",
                 'bench_x.S.time_a"; touch MARK; "', "bench_x.S.time_a' && touch MARK && echo '",
                 "bench_x.S.time_a\\'; touch MARK #", "bench_x.S.time_a | touch MARK", "bench_x.S.time_a'\"'\"'"]


def _expected(commit: str, pattern: str, quiet: bool = False) -> list[str]:
    wait = ["--wait-quiet", "600", "--require-quiet"] if quiet else []
    return ["git", "checkout", commit, "&&", "python3", "-m", "pip", "install", "-e", ".[bench]", "&&",
            "speedlib", "run", *wait, "--bench", pattern]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_the_reproduce_line_parses_to_exactly_the_intended_command(df, tmp_path, name):
    name = name.replace("MARK", str(tmp_path / "mark"))
    sources = _sources(df, names=[TIME, name])
    commit = sources["commit"].iloc[0]
    (command,) = _reproduce_lines(_table(sources))
    argv = shlex.split(command)
    assert argv[:-1] == _expected(commit, "")[:-1]
    pattern = argv[-1]
    assert pattern.startswith("^(") and pattern.endswith(")")
    # the regex names exactly these benchmarks
    assert re.fullmatch(pattern[1:], name) and re.fullmatch(pattern[1:], TIME)
    assert not re.fullmatch(pattern[1:], TIME + "x") and not re.fullmatch(pattern[1:], "bench_x.S.time_a")
    assert argv == _expected(commit, pattern)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed here: the paste test needs it")
@pytest.mark.parametrize("commit, name", [(None, n) for n in HOSTILE_NAMES] + [(c, TIME) for c in HOSTILE_COMMITS[:5]])
def test_pasting_the_reproduce_line_into_bash_runs_nothing_else(df, tmp_path, commit, name):
    """Each command the line names is a stub that prints its arguments: anything else that
    the pasted line ran would create the mark."""
    mark = tmp_path / "mark"
    name = name.replace("MARK", str(mark))
    sources = _sources(df, commit=commit.replace("MARK", str(mark)) if commit else None, names=[TIME, name])
    stubs = "".join(f"{c}() {{ printf '%s\\0' {c} \"$@\"; }}\n" for c in ("git", "python3", "speedlib"))
    for command in _reproduce_lines(_table(sources)):
        done = subprocess.run(["bash", "-c", stubs + command], cwd=tmp_path, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        said = done.stdout.decode().split("\0")[:-1]
        assert said == [a for a in _expected(sources["commit"].iloc[0], shlex.split(command)[-1]) if a != "&&"]
    assert not mark.exists()


# --- case 2: BibTeX from CITATION.cff -------------------------------------------------------

def _entries(bib: str) -> list[tuple[str, str, dict[str, str]]]:
    """What a BibTeX reader sees: an entry starts at an '@' outside braces, and braces nest
    whether or not a backslash stands before them (BibTeX counts them all)."""
    entries, i = [], 0
    while (at := bib.find("@", i)) >= 0:
        open_ = bib.index("{", at)
        depth, j = 0, open_
        while True:
            depth += {"{": 1, "}": -1}.get(bib[j], 0)
            if depth == 0:
                break
            j += 1  # an unbalanced entry runs off the end: IndexError, the test fails
        body, parts, depth, start = bib[open_ + 1:j], [], 0, 0
        for k, c in enumerate(body):
            depth += {"{": 1, "}": -1}.get(c, 0)
            if c == "," and depth == 0:
                parts.append(body[start:k])
                start = k + 1
        parts.append(body[start:])
        fields = {}
        for part in parts[1:]:
            if part.strip():
                key, _, value = part.partition("=")
                value = value.strip()
                assert value.startswith("{") and value.endswith("}"), value
                assert key.strip() not in fields, f"{key.strip()} twice"  # a field added by the file
                fields[key.strip()] = value[1:-1]
        entries.append((bib[at + 1:open_], parts[0].strip(), fields))
        i = j + 1
    return entries


# What the escaped text may hold, and what each stands for.
_BIB_ESCAPES = {r"\textbackslash{}": "\\", r"\textbraceleft{}": "{", r"\textbraceright{}": "}",
                r"\textasciitilde{}": "~", r"\textasciicircum{}": "^", r"\textless{}": "<", r"\textgreater{}": ">",
                r"\textbar{}": "|", r"\&": "&", r"\%": "%", r"\$": "$", r"\#": "#", r"\_": "_"}
_BIB_ESCAPE = re.compile("|".join(re.escape(k) for k in _BIB_ESCAPES))


def _cff(**changes) -> str:
    import yaml  # noqa: PLC0415 - needs_yaml

    meta = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    meta.update(changes)
    return yaml.safe_dump(meta, allow_unicode=True)


HOSTILE_TITLES = ["x}, note = {injected", "x}}\n@misc{evil, title = {pwned", "\\input{/etc/passwd}",
                  "\\immediate\\write18{rm -rf ~}", "unbalanced { brace", "unbalanced } brace",
                  "100% & $x$ # _ ^ ~ \\", "@comment{x}", "a\n\n\\par b", 'x" # "y', "}}}}{{"]
FIELDS = {"author", "title", "version", "year", "url", "license", "note"}


@needs_yaml
@pytest.mark.parametrize("title", HOSTILE_TITLES)
def test_a_hostile_title_stays_one_literal_field_of_one_entry(title):
    bib = report.bibtex(_cff(title=title))
    ((kind, key, fields),) = _entries(bib)
    assert kind == "software" and key == "speedlib2026" and set(fields) == FIELDS
    assert _BIB_ESCAPE.sub(lambda m: _BIB_ESCAPES[m.group()], fields["title"]) == printable(title)
    for value in fields.values():  # no command of the file's survives: every backslash is an escape's
        assert "\\" not in _BIB_ESCAPE.sub("", value), value
        assert "\n" not in value


@needs_yaml
@pytest.mark.parametrize("field", ["message", "license", "version", "repository-code"])
def test_every_field_from_the_file_is_escaped(field):
    bib = report.bibtex(_cff(**{field: "x}, title = {evil}\n@misc{y, \\input{z}"}))
    ((_, _, fields),) = _entries(bib)
    assert set(fields) == FIELDS and "evil" not in fields["title"]
    assert all("\\" not in _BIB_ESCAPE.sub("", v) for v in fields.values())


@needs_yaml
def test_hostile_author_names_and_date_stay_in_their_fields():
    bib = report.bibtex(_cff(authors=[{"name": "org} and {x"}, {"family-names": "a}b", "given-names": "\\c"}],
                             **{"date-released": "2026}, title = {x"}))
    ((_, key, fields),) = _entries(bib)
    assert key == "speedlib2026" and fields["year"] == "2026" and fields["title"].startswith("speedlib: ")
    # BibTeX separates authors at an " and " outside braces: two authors, the organisation whole
    depth, authors, start = 0, [], 0
    author = fields["author"]
    for i, c in enumerate(author):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth == 0 and author.startswith(" and ", i):
            authors.append(author[start:i])
            start = i + len(" and ")
    authors.append(author[start:])
    assert len(authors) == 2 and authors[0].startswith("{") and authors[0].endswith("}")
    assert "\\" not in _BIB_ESCAPE.sub("", author)


# --- case 3: a CITATION.cff that is not what it should be: one line, never a traceback ----

BAD_CFF = {
    "a list": "- a\n- b\n", "a string": "just a line\n", "a number": "12\n",
    "python tag": "title: !!python/object/apply:os.system ['touch MARK']\n",
    "python object": "!!python/object:os.PathLike {}\n",
    "title is a list": "title: [a, b]\n", "title is a mapping": "title: {a: b}\n",
    "authors is a string": "title: t\nauthors: someone\n", "author is a string": "title: t\nauthors: [someone]\n",
    "author name is a list": "title: t\nauthors:\n  - name: [x]\n", "date is a list": "title: t\ndate-released: [1]\n",
    "unterminated": "title: 'unterminated\n", "bad indentation": "title: t\n  - x\n: y\n",
    "tab": "title:\n\t- x\n", "deep": "[" * 10_000 + "]" * 10_000 + "\n",
    "two documents": "title: a\n---\ntitle: b\n",
    "a date that is no date": "title: t\ndate-released: 2026-13-45\n", "empty": "",
    "a list as a field's name": "? [a, b]\n: c\n",
}


@needs_yaml
@pytest.mark.parametrize("name", BAD_CFF)
def test_a_malformed_citation_cff_is_one_clear_line(name, tmp_path):
    mark = tmp_path / "mark"
    with pytest.raises(ValueError) as e:
        report.bibtex(BAD_CFF[name].replace("MARK", str(mark)))
    message = str(e.value)
    assert message.startswith("CITATION.cff") and "\n" not in message and len(message) < 300, message
    assert not mark.exists()  # the tag ran nothing


# --- case 4: a value of 0 (a benchmark that retains no bytes) -------------------------------

INFINITE = re.compile(r"(?<![a-z])inf(?![a-z])")  # "+inf%", "infx"; not "inference_mode"


def _track_history(values: list[float], kind: str = "memory") -> pd.DataFrame:
    """One track benchmark across commits, a day apart: one value each, no interval."""
    rows = []
    for i, v in enumerate(values):
        day = pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(days=i)
        rows.append({"machine": "m", "benchmark": "bench_x.S.track_bytes", "params": "variant=on", "kind": kind,
                     "unit": "bytes", "commit": (f"{i + 1:x}" * 40)[:40], "commit_date": day, "run_date": day,
                     "value": v, "ci99_low": None, "ci99_high": None, "n": 1, "repeat": 1, "samples": []})
    return pd.DataFrame(rows)


def test_a_history_through_zero_is_computed_and_said():
    h = report.history(_track_history([0.0, 0.0, 5e6, 0.0]))
    assert list(h["direction"]) == ["", "", "regression", "improvement"]  # from 0 and back, as asv compare
    t = report.history_table(_track_history([0.0, 0.0, 5e6, 0.0]), "bench_x.S.track_bytes")
    changes = list(t.frame["change"])
    assert changes[0] == "" and changes[1] == "+0.0%" and changes[3] == "-100.0%"
    assert not INFINITE.search(changes[2]) and "n/a" in changes[2]  # no ratio to 0: said, not "+inf%"


def test_steps_through_zero_are_sought_without_dividing_by_it():
    h = report.history(_track_history([0.0] * 8 + [5e6] * 8))
    assert h["step"].sum() == 1 and h.loc[h["step"], "step_direction"].item() == "regression"


def test_the_regression_gate_through_zero(tmp_path):
    rows = _track_history([0.0, 5e6])
    table = report.change_table(rows, rows["commit"].iloc[0][:8], rows["commit"].iloc[1][:8])
    assert list(table.frame["verdict"]) == ["regression"] and "n/a" in table.frame["change"].iloc[0]


@pytest.mark.parametrize("argv", [["--fail-on-regression", "554351ba", "1f8674ca"],
                                  ["--fail-on-regression", "532d5a48", "44f05f8a"],  # both measured RETAINED (on: 0)
                                  ["--table", "history", "--benchmark", RETAINED]])
def test_report_on_the_committed_zero_values(argv, capsys):
    code = cli.main(["report", "--results", str(ROOT / "results"), *argv])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in err and not INFINITE.search(out)
    assert out.startswith("## ")


def test_tables_with_a_zero_value_say_the_ratio_is_undefined(df):
    last = report.latest(df[df["machine"] == "synthetic-h100"])
    zero_variant = last.assign(value=last["value"].where(last["variant"] != "speedlib", 0.0))
    zero_baseline = last.assign(value=last["value"].where(last["variant"] != "forloop", 0.0))
    for table in (report.speedup_table(zero_variant), report.memory_table(zero_baseline)):
        cells = table.frame.astype(str).to_numpy().ravel()
        assert not any(INFINITE.search(c) or "nan" in c for c in cells), table.title
        assert any("undefined" in c for c in cells), table.title
        for export in (report.to_markdown, report.to_csv, report.csv_provenance, report.to_latex):
            export(table)


# --- case 7: docs/results.md writes machine and GPU names as text ---------------------------

EVIL = "m`x``<img src=x onerror=alert(1)>[x](javascript:alert(1))|"


def _code_spans(line: str) -> tuple[list[str], str]:
    """A Markdown line's code spans (CommonMark: a backtick run opens one, the next run of the
    same length closes it; a backslash escapes a backtick outside), and the text outside them."""
    spans, outside, i = [], [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            outside.append(line[i:i + 2])
            i += 2
            continue
        fence = re.match("`+", line[i:])
        if fence:
            end = re.compile(f"(?<!`){fence.group()}(?!`)").search(line, i + len(fence.group()))
            if end:
                text = line[i + len(fence.group()):end.start()]
                spans.append(text[1:-1] if text.startswith(" ") and text.endswith(" ") and text.strip() else text)
                i = end.end()
                continue
        outside.append(line[i])
        i += 1
    return spans, "".join(outside)


def test_the_writeup_escapes_machine_and_gpu_names(tree, tmp_path):
    evil = tmp_path / "results"
    shutil.copytree(tree, evil)
    (evil / "synthetic-h100").rename(evil / EVIL)
    for record in (evil / EVIL / "environment").glob("*.jsonl"):
        record.write_text(record.read_text().replace("NVIDIA H100 80GB HBM3 (synthetic)", EVIL + "\\n# Heading"))
    page = writeup.writeup(load_results(evil).measured)
    section = page[page.index("## Machines"):page.index("## At a glance")]
    (line,) = [line for line in section.splitlines() if "img" in line]
    # the code spans hold the name whole; outside them, nothing is Markdown or HTML
    spans, outside = _code_spans(line)
    assert EVIL in spans
    assert not re.search(r"[<>\[\]`|]", re.sub(r"\\[\\|`\[\]]|&(lt|gt|amp);", "", outside)), outside
    assert not any(line.startswith("# Heading") for line in page.splitlines())


# --- case 8: an empty table exports as one ----------------------------------------------

@pytest.mark.parametrize("table", [lambda df: report.paired_table(df.iloc[0:0]),
                                   lambda df: report.speedup_table(df.iloc[0:0]),
                                   lambda df: report.Table("nothing", pd.DataFrame(), df.iloc[0:0])])
def test_an_empty_table_exports_valid_markdown_and_latex(df, table):
    t = table(df)
    lines = report.to_markdown(t).splitlines()
    rows = [line for line in lines if line.startswith("|")]
    if rows:  # a header, its separator, as many cells in each
        assert len(rows) >= 2 and re.fullmatch(r"\|(---\|)+", rows[1])
        assert rows[0].count(" | ") + 1 == rows[1].count("---")
    else:
        assert any("no rows" in line.lower() for line in lines)
    latex = report.to_latex(t)
    assert r"\begin{tabular}{}" not in latex and "\n \\\\\n" not in latex
    assert latex.count(r"\begin{") == latex.count(r"\end{")


# --- the dashboard: cases 3 to 6 on its pages -------------------------------------------------

@pytest.fixture
def app(monkeypatch):
    """`app(results, page, **query)`: the page run as the dashboard tests run it (AppTest)."""
    pytest.importorskip("streamlit", reason="the dashboard extra is not installed (pip install -e '.[dashboard]')")
    from dashboard_bits import app_on  # noqa: PLC0415 - needs streamlit

    return lambda results, page, **query: app_on(results, page, monkeypatch, **query)


def test_the_history_page_of_a_zero_value(app):
    at = app(ROOT / "results", "views/history.py", benchmark=RETAINED)
    assert not at.exception, at.exception
    assert at.dataframe or at.table  # the table is there (a grid or, too wide for 1440 px, static), 0 -> 0 and all
    # the 0-byte line is in the legend but off the log axis: the page says so
    said = [c.value for c in at.caption if c.value.startswith("Not drawn on the log scale")]
    assert len(said) == 1 and "variant=on" in said[0], [c.value for c in at.caption]


PAGES = ["views/overview.py", "views/history.py", "views/machines.py", "views/cite.py",
         *[f"/{name}" for name in report.TECHNIQUES]]


@pytest.fixture(scope="module")
def two_files_of_one_commit(tmp_path_factory) -> Path:
    """The committed results, and the newest result file of one machine once more under
    another environment name: the same commit run again by another interpreter."""
    tree = tmp_path_factory.mktemp("twice") / "results"
    shutil.copytree(ROOT / "results", tree)
    machine = tree / "cpu-2core-intel-xeon"
    newest = max(machine.glob("*-existing-*.json"), key=lambda p: json.loads(p.read_text())["date"])
    data = json.loads(newest.read_text())
    data["env_name"] = "existing-py_usr_bin_python3.12"
    (machine / f"{newest.name[:8]}-existing-py_usr_bin_python3.12.json").write_text(json.dumps(data))
    return tree


@pytest.mark.parametrize("page", PAGES)
def test_two_result_files_of_one_commit_break_no_page(app, two_files_of_one_commit, page):
    at = app(two_files_of_one_commit, page, machine="cpu-2core-intel-xeon")
    assert not at.exception, at.exception


def test_the_latest_results_hold_each_case_once(two_files_of_one_commit):
    last = report.latest(load_results(two_files_of_one_commit).measured)
    assert not last.duplicated(["machine", "benchmark", "params"]).any()


@pytest.mark.parametrize("until", ["-1", "-99999999999", "99999-01-01", "1e30", "garbage",
                                   "0000-01-01T00:00:00Z", "10000-01-01T00:00:00Z"])
@pytest.mark.parametrize("page", ["views/overview.py", "/amp"])
def test_an_unreadable_or_out_of_range_until_says_so_and_shows_nothing(app, tree, until, page):
    """Issue 51: a link whose until= is no time silently became the newest date, and its
    numbers passed for the pinned ones. It is a citation gone wrong: said, nothing shown, the
    link left as it was."""
    at = app(tree, page, until=until)
    assert not at.exception, at.exception
    said = " ".join(e.value for e in at.error)
    assert f"until= '{until}' is not a time" in said.replace("\\", ""), said
    assert not at.dataframe and not at.table and not at.get("plotly_chart"), "nothing shown but the error"
    assert dict(at.query_params)["until"] == until


def test_an_empty_until_is_no_pin_at_all(app, tree):
    newest = dict(app(tree, "views/overview.py").query_params)["until"]
    at = app(tree, "views/overview.py", until="")
    assert not at.exception and not at.error, at.exception
    assert dict(at.query_params)["until"] == newest


@pytest.mark.parametrize("page", ["views/overview.py", "/amp", "views/machines.py"])
def test_a_link_pinned_before_the_first_result_says_so_not_that_there_are_none(app, tree, page):
    """On every page (a technique page said "No measured results for this technique yet")."""
    at = app(tree, page, until="2000-01-01T00:00:00Z")
    assert not at.exception, at.exception
    said = " ".join(e.value for e in at.error)
    assert "pinned to 2000-01-01 00:00:00 UTC" in said and "before the first result" in said, said
    assert not any("No measured results" in i.value or "Produce some with" in i.value for i in at.info)
    assert any("newer result(s)" in b.label for b in at.button)  # the way to the results there are


def _cite_page(results: Path, citation: bytes, tmp_path: Path, monkeypatch):
    """The cite page with `citation` as the repository's CITATION.cff."""
    from streamlit.testing.v1 import AppTest  # noqa: PLC0415 - needs streamlit, which the `app` fixture skips without

    root = tmp_path / "checkout"
    root.mkdir()
    (root / "CITATION.cff").write_bytes(citation)
    monkeypatch.setenv("SPEEDLIB_RESULTS", str(results))
    for module in ("_view", "_technique"):
        sys.modules.pop(module, None)
    monkeypatch.syspath_prepend(str(ROOT / "dashboard"))
    import _view  # noqa: PLC0415 - the module the page will import, with the CITATION.cff above

    monkeypatch.setattr(_view, "ROOT", root)
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=60)
    at.switch_page("views/cite.py")
    return at.run()


@needs_yaml
@pytest.mark.parametrize("name", ["a list", "python tag", "title is a list", "authors is a string", "unterminated"])
def test_the_cite_page_says_what_is_wrong_with_citation_cff(app, tree, tmp_path, monkeypatch, name):
    at = _cite_page(tree, BAD_CFF[name].replace("MARK", str(tmp_path / "mark")).encode(), tmp_path, monkeypatch)
    assert not at.exception, at.exception
    assert any(w.value.startswith("CITATION.cff") for w in at.warning)
    with pytest.raises(ValueError) as e:
        report.bibtex(BAD_CFF[name].replace("MARK", str(tmp_path / "mark")))
    assert [t.value for t in at.text if t.value == str(e.value)]  # the line that says what is wrong, as text
    assert at.dataframe or at.table  # the rest of the page is there


@needs_yaml
def test_the_cite_page_on_a_citation_cff_that_is_not_utf8(app, tree, tmp_path, monkeypatch):
    at = _cite_page(tree, b"title: \xff\xfe\n", tmp_path, monkeypatch)
    assert not at.exception, at.exception
    assert any(w.value.startswith("CITATION.cff") for w in at.warning)
    assert any("not UTF-8" in t.value for t in at.text)


@needs_yaml
def test_the_cite_page_escapes_a_hostile_title(app, tree, tmp_path, monkeypatch):
    at = _cite_page(tree, _cff(title="x}, note = {injected").encode(), tmp_path, monkeypatch)
    assert not at.exception, at.exception
    (bib,) = [c.value for c in at.code if c.value.startswith("@software")]
    ((_, _, fields),) = _entries(bib)
    assert set(fields) == FIELDS


def test_a_chart_of_a_ratio_that_divides_by_zero(app):
    """A baseline that retained 0 bytes: its memory ratio has no value, and no bar; the rest draw."""
    from speedbench.report import charts  # noqa: PLC0415 - plotly, which the `app` fixture skips without

    s = pd.DataFrame({"case": ["a", "b", "c"], "machine": ["m"] * 3, "ratio": [float("inf"), 0.5, float("nan")],
                      "ratio_low": [float("nan"), 0.4, float("nan")], "ratio_high": [float("nan"), 0.6, float("nan")]})
    fig = charts.ratio_chart(s, "case", "machine", "t", exact=True)
    layout = json.loads(fig.to_json())["layout"]
    assert all(abs(v) < 100 for v in layout["xaxis"]["range"])  # the axis spans the finite ratio and 1x


@pytest.mark.parametrize("newest", [pd.Timestamp.max.tz_localize("UTC"), pd.Timestamp("9999-12-31T23:59:59.5Z"),
                                    pd.Timestamp(1e15, unit="ms", tz="UTC")])
def test_a_newest_result_at_the_end_of_the_range_of_dates_is_not_pinned(app, newest):
    """A run date pandas holds but a link cannot (past 9999, or rounding up past pandas' end)."""
    sys.path.insert(0, str(ROOT / "dashboard"))
    import _view  # noqa: PLC0415 - found through the line above

    assert _view._link_time(newest, ceil=True) is None
    assert _view._link_time(pd.Timestamp("2026-11-24T10:47:13.2Z"), ceil=True) == "2026-11-24T10:47:14Z"


def test_the_headline_of_a_baseline_that_used_no_memory():
    """Checkpointing's cell divides the variant's peak memory by the baseline's."""
    df = load_results(ROOT / "results").measured
    peak = (df["suite"] == "PeakMemory") & (df["variant"] == "none")
    assert peak.any()  # the committed H100 run measured it
    grid = headline.grid(df.assign(value=df["value"].mask(peak, 0.0)))
    cells = grid.frame.astype(str).to_numpy().ravel()
    assert not any(INFINITE.search(c) for c in cells)
    assert any("peak memory undefined" in c for c in cells)


def test_a_variant_name_on_a_technique_page_stays_in_its_code_span(app, tree, tmp_path):
    evil_tree, name = tmp_path / "results", "ev`<b>[a](javascript:alert(1))"
    shutil.copytree(tree, evil_tree)
    for path in evil_tree.rglob("*.json"):  # the variant `fused`, renamed in the results and in asv's listing
        path.write_text(path.read_text().replace("'fused'", json.dumps(repr(name))[1:-1]))
    at = app(evil_tree, "/contiguous", machine="synthetic-h100", baseline=name)
    assert not at.exception, at.exception
    (line,) = [m.value for m in at.markdown if "Separately timed" in m.value]
    spans, outside = _code_spans(line)
    assert name in spans and "javascript" not in outside


def test_captions_that_name_a_machine_are_text_not_markdown(app, tmp_path):
    """A machine with results from two environments is named in a caption under the table."""
    evil = "[x](javascript:alert(1))<img src=x onerror=alert(2)>"
    synthetic.write_results(tmp_path, commits=2, machines=2)
    records = sorted((tmp_path / "synthetic-h100" / "environment").glob("*.jsonl"))
    records[-1].write_text(records[-1].read_text().replace('"torch": "', '"torch": "9.9.9+'))  # a newer torch build
    (tmp_path / "synthetic-h100").rename(tmp_path / evil)
    at = app(tmp_path, "views/machines.py")
    assert not at.exception, at.exception
    (said,) = [c.value for c in at.caption if "environments" in c.value]
    assert not re.search(r"[<>\[\]]", re.sub(r"\\[\\|`\[\]]|&(lt|gt|amp);", "", said)), said


def test_a_reproduce_command_for_no_benchmark_is_refused_not_a_whole_suite_rerun():
    """'--bench ^()' matches every benchmark: a citation's rerun would measure the whole suite."""
    with pytest.raises(ValueError, match="needs the benchmarks it reruns"):
        report.reproduce_command("1f8674ca", [])
