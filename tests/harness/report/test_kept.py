"""speedbench.report.kept: a table kept on disk is the table computed, read back only for the same
content (tree, rows, name, code), computed once where two ask at once, and never needed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from speedbench.report import headline, kept
from speedbench.results import cache, pickled, synthetic


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "results"
    synthetic.write_results(root, commits=2, machines=2)
    return root


def _loaded(root: Path) -> tuple[str, pd.DataFrame]:
    signature = cache.fingerprint(root)
    return signature, cache.load(root, key=signature).measured


def _never():
    pytest.fail("computed again")


def test_a_kept_table_is_the_one_computed_and_comes_back_without_computing(tree):
    signature, rows = _loaded(tree)
    computed = kept.table(tree, signature, "headline", rows, lambda: headline.grid(rows))
    again = kept.table(tree, signature, "headline", rows, _never)
    fresh = headline.grid(rows)
    for table in (computed, again):
        pd.testing.assert_frame_equal(table.frame, fresh.frame)
        pd.testing.assert_frame_equal(table.data, fresh.data)
        assert table.notes == fresh.notes
    assert list((cache.place(tree, "tables", suffix="")).glob("headline-*.pickle"))
    assert not any(p.is_relative_to(tree) for p in cache.cache_dir().rglob("*"))  # nothing written in results/


def test_other_rows_another_name_a_changed_tree_or_changed_code_compute_afresh(tree, monkeypatch):
    signature, rows = _loaded(tree)
    kept.table(tree, signature, "headline", rows, lambda: "all rows")
    one = rows[rows["machine"] == rows["machine"].iloc[0]]
    assert kept.table(tree, signature, "headline", one, lambda: "one machine") == "one machine"  # a filter, a pin
    assert kept.table(tree, signature, "claims", rows, lambda: "claims") == "claims"
    assert kept.table(tree, signature, "headline", rows, lambda: "also", "wider") == "also"  # the caller's own key
    # a result file rewritten: the tree's fingerprint moves, the rows (their IDs) may not
    result = next(tree.glob("*/*-existing-*.json"))
    result.write_text(result.read_text().replace('"version"', '"versiom"', 1))
    changed, _ = _loaded(tree)
    assert changed != signature
    assert kept.table(tree, changed, "headline", rows, lambda: "new tree") == "new tree"
    with monkeypatch.context() as m:
        m.setattr(kept, "_CODE", b"an edited speedbench")
        assert kept.table(tree, signature, "headline", rows, lambda: "new code") == "new code"
    assert kept.table(tree, signature, "headline", rows, _never) == "all rows"  # the first is still there


def test_rows_without_unique_result_ids_are_never_kept(tree):
    signature, rows = _loaded(tree)
    calls = []
    for frame in (rows.drop(columns="result_id"), pd.concat([rows, rows.iloc[:1]])):
        for _ in range(2):
            kept.table(tree, signature, "headline", frame, lambda: calls.append(1) or "x")
    assert len(calls) == 4
    assert kept.key(signature, "headline", rows) != kept.key(signature, "headline", rows.iloc[1:])
    assert kept.key(signature, "headline", rows) == kept.key(signature, "headline", rows.iloc[::-1])  # order: same rows


def test_two_asking_at_once_compute_once(tree):
    """The dashboard's warm-up and its first page: the second waits for the first's table."""
    signature, rows = _loaded(tree)
    started, calls = threading.Event(), []

    def slow():
        calls.append("first")
        started.set()
        time.sleep(0.5)
        return "the first one's"

    first = threading.Thread(target=lambda: kept.table(tree, signature, "every", rows, slow))
    first.start()
    assert started.wait(10)
    assert kept.table(tree, signature, "every", rows, lambda: calls.append("second") or "the second one's") == \
        "the first one's"
    first.join()
    assert calls == ["first"]


def test_a_holder_that_hangs_is_waited_for_a_bounded_time(tmp_path):
    path = tmp_path / "t.pickle"
    with pickled.computing(path):
        start = time.monotonic()
        with pickled.computing(path, wait_s=0.3):  # another open of the lock file: it conflicts
            waited = time.monotonic() - start
    assert 0.3 <= waited < 5


def test_only_the_newest_tables_of_a_tree_are_kept(tree, monkeypatch):
    signature, rows = _loaded(tree)
    monkeypatch.setattr(kept, "KEEP", 3)
    for i in range(6):
        kept.table(tree, signature, "headline", rows.iloc[i:], lambda i=i: i)
        time.sleep(0.01)  # distinct mtimes
    directory = cache.place(tree, "tables", suffix="")
    assert len(list(directory.glob("*.pickle"))) == 3
    assert kept.table(tree, signature, "headline", rows.iloc[5:], _never) == 5
    assert kept.table(tree, signature, "headline", rows, lambda: "gone") == "gone"  # the oldest went


def test_an_unwritable_cache_only_costs_time(tree, unwritable, monkeypatch):
    monkeypatch.setenv("SPEEDLIB_CACHE_DIR", str(unwritable / "cache"))
    signature, rows = _loaded(tree)
    calls = []
    for _ in range(2):
        assert kept.table(tree, signature, "headline", rows, lambda: calls.append(1) or "t") == "t"
    assert len(calls) == 2


def test_a_kept_file_others_could_write_is_never_unpickled(tree):
    signature, rows = _loaded(tree)
    kept.table(tree, signature, "headline", rows, lambda: "mine")
    (stored,) = cache.place(tree, "tables", suffix="").glob("headline-*.pickle")
    stored.chmod(0o666)
    assert kept.table(tree, signature, "headline", rows, lambda: "computed") == "computed"


def test_speedlib_report_reads_back_the_headline_it_kept(tree, monkeypatch, capsys):
    from speedbench import cli  # noqa: PLC0415 - the command, as a user runs it twice

    assert cli.main(["report", "--results", str(tree), "--table", "headline"]) == 0
    first = capsys.readouterr().out
    monkeypatch.setattr(headline, "grid", lambda df: pytest.fail("computed again"))
    assert cli.main(["report", "--results", str(tree), "--table", "headline"]) == 0
    assert capsys.readouterr().out == first and "Headline" in first
