"""speedbench.report.age: how far behind the checkout's HEAD a figure is, and whether the
technique's code changed since (issue 44: every GPU figure was 138 commits old, said nowhere)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from speedbench.report import age

GIT = ["-c", "user.name=t", "-c", "user.email=t@t"]


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, capture_output=True)
    subprocess.run(["git", *GIT, "commit", "-qm", message], cwd=repo, check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_commits_since_and_those_that_changed_the_techniques_code(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    measured = _commit(repo, {"speedlib/__init__.py": "", "speedlib/foo.py": "from speedlib import _foo_x\n",
                              "speedlib/_foo_x.py": "from ._foo_y import y\n", "speedlib/_foo_y.py": "y = 1\n",
                              "speedlib/bar.py": "x = 1\n"}, "measured here")
    _commit(repo, {"speedlib/_foo_y.py": "y = 2\n"}, "foo's code, two imports down")
    _commit(repo, {"speedlib/bar.py": "x = 2\n"}, "another technique")
    _commit(repo, {"README": "words\n"}, "no code")
    assert age.technique_files("foo", repo) == ("speedlib/foo.py", "speedlib/_foo_x.py", "speedlib/_foo_y.py")
    foo, bar = age.behind(measured, "foo", repo), age.behind(measured[:8], "bar", repo)
    assert (foo.commits, foo.changed) == (3, 1) and (bar.commits, bar.changed) == (3, 1)
    assert str(foo) == (f"measured at {measured[:8]}, 3 commits behind HEAD; speedlib/foo.py and 2 module(s) it "
                        "imports changed in 1 of them")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert str(age.behind(head, "foo", repo)).endswith("0 commits behind HEAD; speedlib/foo.py and 2 module(s) it "
                                                        "imports unchanged since")


def test_a_technique_moved_into_a_package_counts_the_changes_under_its_old_paths(tmp_path):
    """speedlib/foo.py and its private modules became speedlib/foo/: a figure measured before the
    move counts the commits that changed the old files (one of them a module born after the
    figure) as well as the move and what followed."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    measured = _commit(repo, {"speedlib/__init__.py": "", "speedlib/foo.py": "from speedlib._foo_x import x\n",
                              "speedlib/_foo_x.py": "x = 1\n", "speedlib/bar.py": "y = 1\n"}, "measured here")
    _commit(repo, {"speedlib/_foo_x.py": "x = 2\n"}, "foo's code under its old path")
    _commit(repo, {"speedlib/bar.py": "y = 2\n"}, "another technique")
    _commit(repo, {"speedlib/foo.py": "from speedlib._foo_x import x\nfrom speedlib._foo_y import y\n",
                   "speedlib/_foo_y.py": "y = 1\n"}, "foo gets a second private module")
    _commit(repo, {"speedlib/_foo_y.py": "y = 2\n"}, "foo's code in a module that lived between the figure and now")
    for old in ("foo.py", "_foo_x.py", "_foo_y.py"):
        (repo / "speedlib" / old).unlink()
    _commit(repo, {"speedlib/foo/__init__.py": "from speedlib.foo.parts import x, y\n",
                   "speedlib/foo/parts.py": "x = 2\ny = 2\n"}, "foo becomes a package")
    _commit(repo, {"speedlib/foo/parts.py": "x = 3\ny = 2\n"}, "foo's code under its new path")
    assert age.technique_files("foo", repo) == ("speedlib/foo/__init__.py", "speedlib/foo/parts.py")
    assert age.technique_files("foo", repo, measured) == ("speedlib/foo.py", "speedlib/_foo_x.py")
    foo = age.behind(measured, "foo", repo)
    assert (foo.commits, foo.changed) == (6, 5)
    assert str(foo) == (f"measured at {measured[:8]}, 6 commits behind HEAD; speedlib/foo/ (2 modules) changed in "
                        "5 of them")


def test_nothing_where_git_the_checkout_or_the_commit_is_missing(tmp_path):
    assert age.behind("0" * 40, "contiguous") is None  # not in this checkout's history
    assert age.behind("--all", "contiguous") is None and age.behind("HEAD~1", "contiguous") is None  # hashes only
    assert age.behind("deadbeef", "no_such_technique") is None
    (tmp_path / "speedlib").mkdir()
    (tmp_path / "speedlib" / "foo.py").write_text("")
    assert age.behind("deadbeef", "foo", tmp_path) is None  # no git repository there


def test_every_cell_at_once_answers_as_one_at_a_time(tmp_path):
    """behind_all (the chart's cells side by side, one HEAD) gives what behind gives for each,
    a commit that is not a hash or not in the history included."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    first = _commit(repo, {"speedlib/__init__.py": "", "speedlib/foo.py": "def f():\n    from speedlib import _foo_x\n",
                           "speedlib/_foo_x.py": "x = 1\n", "speedlib/bar.py": "x = 1\n"}, "measured here")
    second = _commit(repo, {"speedlib/_foo_x.py": "x = 2\n"}, "foo's code, imported inside a function")
    _commit(repo, {"speedlib/bar.py": "x = 2\n"}, "another technique")
    pairs = [(c, t) for c in (first, second[:8], "--all", "0" * 40) for t in ("foo", "bar", "no_such_technique")]
    together = age.behind_all(pairs + pairs[:2], repo)  # a pair asked twice is answered once
    assert list(together) == pairs
    assert together == {p: age.behind(*p, repo) for p in pairs}
    assert (together[first, "foo"].commits, together[first, "foo"].changed) == (2, 1)  # the import in a function counts
    assert together["--all", "foo"] is None and together["0" * 40, "bar"] is None
    assert age.behind_all([(first, "foo")], tmp_path) == {(first, "foo"): None}  # no repository there
