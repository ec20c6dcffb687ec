"""Every noqa marker says why (issue 41): a marker naming only a rule's code hides the rule's
finding with no reason a reader can weigh. benchmarks/ included: its versions are hand-set
(benchmarks/versions.json), so a lint pass there orphans no result."""

import re
import subprocess

from project_bits import ROOT

MARKER = re.compile(r"#\s*noqa\b(?P<rest>.*)$")
WITH_WHY = re.compile(r":\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+-\s+\S")


def _python_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def bare_markers(lines: list[str]) -> list[int]:
    """Line numbers (from 1) whose noqa marker names no code or gives no reason after ' - '."""
    bare = []
    for number, line in enumerate(lines, 1):
        found = MARKER.search(line)
        if found and not WITH_WHY.match(found.group("rest")):
            bare.append(number)
    return bare


def test_the_check_tells_a_reason_from_none():
    noqa = "#" " noqa"  # split, so that this file's own lines hold no marker
    lines = [f"import torch  {noqa}: PLC0415",
             f"import torch  {noqa}",
             f"x = 1  {noqa}: E731 - a name reads better in the traceback",
             f"import a  {noqa}: F401, PLC0415 - re-exported for callers",
             "y = 2"]
    assert bare_markers(lines) == [1, 2]


def test_every_noqa_marker_says_why():
    bare = []
    for name in _python_files():
        lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
        bare += [f"{name}:{n}" for n in bare_markers(lines)]
    assert not bare, f"{len(bare)} noqa markers without ' - why': " + ", ".join(bare[:20])
