"""`speedlib versions` against a damaged ledger and hostile arguments (issue 54's hostile pass over
issue 50): a ledger that is a FIFO held every command that checks versions (a run included), a
nested or misshapen one ended in a traceback, a --why of two lines went into the ledger, --recover
took a missing tree as an empty one and a torn result file as a traceback, and --bump wrote
through a linked benchmark file. Each is one line now, exit 2, nothing changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from project_bits import commit_all, git
from test_versions import _versions, toy  # noqa: F401 - toy is the fixture these tests use

LEDGER = Path("benchmarks") / "versions.json"


@pytest.fixture
def recorded(toy):  # noqa: F811 - the fixture above, given on
    out = _versions(toy, "--bump", "--why", "first")
    assert out.returncode == 0, out.stderr
    return toy


def refused(root: Path, *args: str) -> str:
    out = _versions(root, *args)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


def test_a_ledger_that_is_a_fifo_is_refused_at_once(recorded):
    (recorded / LEDGER).unlink()
    os.mkfifo(recorded / LEDGER)
    assert "is not a regular file" in refused(recorded)  # it waited for a writer, for ever


def test_a_ledger_that_is_a_link_to_nothing_is_refused(recorded):
    (recorded / LEDGER).unlink()
    (recorded / LEDGER).symlink_to(recorded / "gone.json")
    assert "is a link to nothing" in refused(recorded)


@pytest.mark.parametrize("text, says", [
    pytest.param("[" * 100_000 + "]" * 100_000, "nested deeper than any ledger is", id="nested"),
    ('{"benchmarks": {"bench_toy.Toy": ["1"]}}', "entry 'bench_toy.Toy' is not an object"),
    ('{"benchmarks": {"bench_toy.Toy": {"version": "1", "versions": []}}}', "does not list its version '1'"),
    ('{"benchmarks": {"bench_toy.Toy": {"version": "1", "versions": {"1": {"fingerprints": ["x"]}}}}}',
     "version '1' is not an object with fingerprints"),
])
def test_a_misshapen_ledger_is_one_line(recorded, text, says):
    (recorded / LEDGER).write_text(text)
    assert says in refused(recorded)
    assert says in refused(recorded, "--same", "bench_toy.Toy", "--why", "x")


@pytest.mark.parametrize("why", ["one\ntwo", "x\x1b[2J", "tab\there"])
def test_a_why_is_one_printable_line(recorded, why):
    before = (recorded / LEDGER).read_bytes()
    assert "--why must be one line of printable text" in refused(recorded, "--same", "bench_toy.Toy", "--why", why)
    assert (recorded / LEDGER).read_bytes() == before


def test_a_long_unknown_name_is_cut_in_the_refusal(recorded):
    err = refused(recorded, "--same", "b" * 100_000, "--why", "x")
    assert len(err) < 400 and "(100000 characters)" in err


@pytest.mark.parametrize("what", ["missing", "file", "fifo"])
def test_recover_refuses_what_is_not_a_results_tree(recorded, tmp_path, what):
    path = tmp_path / "given"
    if what == "file":
        path.write_text("")
    elif what == "fifo":
        os.mkfifo(path)
    assert f"--recover {path} is not a results directory" in refused(recorded, "--recover", str(path))


def test_recover_leaves_a_torn_result_file_as_it_was_and_says_so(recorded, tmp_path):
    git(recorded, "init", "-q", "-b", "main")
    commit_all(recorded, "recorded")
    tree = tmp_path / "results"
    (tree / "m").mkdir(parents=True)
    (tree / "benchmarks.json").write_text("{}")
    (tree / "m" / "machine.json").write_text('{"machine": "m"}')
    torn = tree / "m" / "0123abcd-x.json"
    torn.write_text('{"results": {')
    out = _versions(recorded, "--recover", str(tree))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "1 result(s) kept as they were: in a file that is not a readable asv result file" in out.stdout
    assert torn.read_text() == '{"results": {'


def test_recover_refuses_a_torn_listing_before_it_rewrites_anything(recorded, tmp_path):
    tree = tmp_path / "results"
    tree.mkdir()
    (tree / "benchmarks.json").write_text("{")
    assert "its benchmarks.json cannot be read" in refused(recorded, "--recover", str(tree))


def test_a_bump_never_writes_through_a_linked_benchmark_file(recorded, tmp_path):
    path = recorded / "benchmarks" / "bench_toy.py"
    outside = tmp_path / "outside.py"
    outside.write_text(path.read_text())
    path.unlink()
    path.symlink_to(outside)
    before = outside.read_text()
    assert "is a link or not a regular file" in refused(recorded, "--bump", "bench_toy.Toy", "--why", "x")
    assert outside.read_text() == before and json.loads((recorded / LEDGER).read_text())[
        "benchmarks"]["bench_toy.Toy"]["version"] == "1"


@pytest.mark.parametrize("planted, says", [
    (b"# \xff\nclass Foo:\n    pass\n", "benchmarks/bench_zz.py is not UTF-8 text (byte 2)"),
    (b"x = " + b"-" * 200_000 + b"1\n", "benchmarks/bench_zz.py does not parse: "),
    (b"class Foo(:\n", "benchmarks/bench_zz.py does not parse: "),
], ids=["not UTF-8", "nested past the parser", "a syntax error"])
def test_a_planted_benchmark_file_that_does_not_parse_is_one_line(recorded, planted, says):
    (recorded / "benchmarks" / "bench_zz.py").write_bytes(planted)
    assert says in refused(recorded)
