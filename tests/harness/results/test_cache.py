"""speedbench.results.cache: a cache of loaded results may make loading faster, never different."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pandas as pd
import pytest

from speedbench.results import cache, synthetic
from speedbench.results import load as results


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "results"
    synthetic.write_results(root, commits=2, machines=2)
    (root / "synthetic-h100" / "broken.json").write_text("{not json")  # a problem to carry along
    return root


def _same(a: results.LoadedResults, b: results.LoadedResults) -> None:
    pd.testing.assert_frame_equal(a.measured, b.measured)
    pd.testing.assert_frame_equal(a.not_measured, b.not_measured)
    assert [str(p) for p in a.problems] == [str(p) for p in b.problems]


def _no_parsing(monkeypatch):
    monkeypatch.setattr(results, "load_results", lambda *a, **k: pytest.fail("parsed again"))


def test_a_cached_load_equals_a_fresh_one_problems_included(tree, monkeypatch):
    fresh = results.load_results(tree)
    assert fresh.problems and len(fresh.measured)
    _same(cache.load(tree), fresh)  # written
    _no_parsing(monkeypatch)
    _same(cache.load(tree), fresh)  # read back, nothing parsed


def test_the_cache_lives_outside_the_results_and_leaves_them_untouched(tree):
    before = sorted((p.relative_to(tree), p.stat().st_mtime_ns) for p in tree.rglob("*"))
    cache.load(tree)
    assert sorted((p.relative_to(tree), p.stat().st_mtime_ns) for p in tree.rglob("*")) == before
    assert list(cache.cache_dir().glob("results-*.pickle"))


@pytest.mark.parametrize("change", ["rewrite", "add", "remove", "environment", "benchmarks"])
def test_any_change_under_the_tree_is_loaded_afresh(tree, change):
    cache.load(tree)
    machine = tree / "synthetic-h200"
    result = next(machine.glob("*-existing-*.json"))
    if change == "rewrite":  # same size, new content and mtime: a value changed
        data = result.read_text()
        result.write_text(data.replace('"version"', '"versiom"', 1))
        os.utime(result, ns=(result.stat().st_atime_ns, result.stat().st_mtime_ns + 10**9))
    elif change == "add":
        shutil.copy(result, machine / ("f" * 8 + "-existing-copy.json"))
    elif change == "remove":
        result.unlink()
    elif change == "environment":
        env = next((machine / "environment").glob("*.jsonl"))
        env.write_text(env.read_text() + '{"torch": "9.9.9", "recorded_at": "2027-01-01T00:00:00+00:00"}\n')
    else:
        listing = tree / "benchmarks.json"
        listing.write_text(listing.read_text() + " ")
    _same(cache.load(tree), results.load_results(tree))


def test_a_same_size_edit_in_place_with_its_mtime_restored_is_loaded_afresh(tree):
    cache.load(tree)
    key = cache.fingerprint(tree)
    result = next((tree / "synthetic-h200").glob("*-existing-*.json"))
    before = result.stat()
    data = result.read_bytes()
    edited = data.replace(b'"version"', b'"versiom"', 1)  # its entries' version column renamed
    assert len(edited) == len(data) and edited != data
    with result.open("r+b") as f:  # the same inode, the same size ...
        f.write(edited)
    os.utime(result, ns=(before.st_atime_ns, before.st_mtime_ns))  # ... and the old mtime, as `touch -r` sets it
    after = result.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert cache.fingerprint(tree) != key
    _same(cache.load(tree), results.load_results(tree))


def test_a_corrupt_cache_file_is_replaced(tree, monkeypatch):
    fresh = cache.load(tree)
    (stored,) = cache.cache_dir().glob("results-*.pickle")
    stored.write_bytes(b"\x80\x05truncated")
    _same(cache.load(tree), fresh)
    _no_parsing(monkeypatch)
    _same(cache.load(tree), fresh)  # rewritten whole


class _Planted:
    """Unpickling this would run code: the flag file shows whether it happened."""

    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return (Path.touch, (self.flag,))


def test_a_cache_file_others_could_write_is_never_unpickled(tree, tmp_path):
    cache.load(tree)
    (stored,) = cache.cache_dir().glob("results-*.pickle")
    flag = tmp_path / "unpickled"
    stored.write_bytes(pickle.dumps(_Planted(flag)))
    stored.chmod(0o666)
    _same(cache.load(tree), results.load_results(tree))
    assert not flag.exists()
    assert stored.stat().st_mode & 0o777 == 0o600  # replaced by a file of ours (mkstemp's mode)


def test_a_cache_directory_inside_the_results_is_not_used(tree, monkeypatch):
    monkeypatch.setenv("SPEEDLIB_CACHE_DIR", str(tree / "cache"))
    _same(cache.load(tree), results.load_results(tree))
    assert not (tree / "cache").exists()


def test_an_unwritable_cache_directory_only_costs_time(tree, monkeypatch, tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv("SPEEDLIB_CACHE_DIR", str(blocked / "cache"))
    _same(cache.load(tree), results.load_results(tree))


def test_a_new_loader_does_not_reuse_old_frames(tree, monkeypatch):
    cache.load(tree)
    calls = []
    real = results.load_results
    monkeypatch.setattr(results, "load_results", lambda root: calls.append(root) or real(root))
    monkeypatch.setattr(cache, "_loader_digest", lambda: b"another speedlib")
    cache.load(tree)
    assert calls == [tree]


def test_a_missing_results_directory_is_reported(tmp_path):
    loaded = cache.load(tmp_path / "nope")
    assert loaded.measured.empty and "no results directory" in str(loaded.problems[0])


def test_a_change_to_any_part_of_the_loader_changes_the_key(tmp_path, monkeypatch):
    """The loader lives in speedbench/results/ (load.py and the parts it parses with): an
    edit to a part must not reuse frames parsed by the old one."""
    source = Path(cache.results.__file__).parent
    for part in source.glob("*.py"):
        shutil.copy(part, tmp_path / part.name)
    monkeypatch.setattr(cache.results, "__file__", str(tmp_path / "load.py"))
    before = cache._loader_digest()
    with (tmp_path / "files.py").open("a") as f:
        f.write("\n# a parser change\n")
    assert cache._loader_digest() != before
