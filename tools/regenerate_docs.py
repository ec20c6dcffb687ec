"""Regenerate every document computed from the committed results, in one command:
docs/results.md (`speedlib report --writeup --against results-rerun`) and docs/glance.svg
(`speedlib publish --chart docs/glance.svg`). tests/test_docs.py and
tests/dashboard/test_glance_image.py fail until both match the results; rerun this after any
change under results/ (new runs, benchmark versions rewritten) or to the report's code, and
commit what it prints as changed.

    python3 tools/regenerate_docs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from speedbench.report import site, writeup  # noqa: E402 - after the checkout's path
from speedbench.results.load import load_results  # noqa: E402 - after the checkout's path


def main() -> int:
    measured = load_results(ROOT / "results").measured
    rerun = load_results(ROOT / "results-rerun").measured if (ROOT / "results-rerun").is_dir() else None
    page, chart = ROOT / "docs" / "results.md", ROOT / "docs" / "glance.svg"
    before = {p: p.read_bytes() if p.is_file() else b"" for p in (page, chart)}
    page.write_text(writeup.writeup(measured, rerun), encoding="utf-8")
    chart.write_text(site.chart(measured), encoding="utf-8")
    for path, old in before.items():
        print(f"{path.relative_to(ROOT)}: {'changed' if path.read_bytes() != old else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
