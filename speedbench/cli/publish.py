"""`speedlib publish --output DIR`: the results as a static site (speedbench.report.site); `--chart PATH`:
the at-a-glance chart as an SVG image (the README's and docs/results.md's)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from speedbench import CHECKOUT
from speedbench.cli import report
from speedbench.results.common import printable

PUBLISH_EXIT_STATUS = """exit status:
  0  written: the site under --output, the image at --chart
  1  no measured results under --results: nothing written
  2  refused, one line on stderr says why: neither --output nor --chart given, no results
     directory"""


def _cmd_publish(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if not (args.output or args.chart):
        print("speedlib publish: say what to write: --output DIR (the site), --chart PATH (the chart's image), "
              "or both", file=sys.stderr)
        return 2
    from speedbench.report import site  # noqa: PLC0415 - pandas and plotly; `speedlib --help` loads none
    from speedbench.results.load import load_results  # noqa: PLC0415 - pandas; `speedlib --help` loads none

    results = Path(args.results)
    if not results.is_dir():
        print(f"speedlib publish: no results directory at {printable(str(results))}", file=sys.stderr)
        return 2
    df = load_results(results).measured
    if df.empty:
        print(f"speedlib publish: no measured results under {printable(str(results))}", file=sys.stderr)
        return 1
    if args.chart:
        site.write_chart(df, Path(args.chart))
        print(f"speedlib publish: the at-a-glance chart in {printable(str(args.chart))}")
    if args.output:
        cff = Path(args.citation)
        written = site.publish(df, Path(args.output), cff.read_text(encoding="utf-8") if cff.is_file() else None)
        print(f"speedlib publish: {len(written)} files in {printable(str(args.output))}; open index.html")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("publish", help="write the results as a static site (no server, no network)",
                       description="Write the results as a static site (the dashboard's pages as HTML files that "
                                   "open from file://) and/or the at-a-glance chart as an SVG image.",
                       epilog=PUBLISH_EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=report.RESULTS,
                   help="results directory (default: this checkout's results/, as `speedlib report`)")
    p.add_argument("--output", "-o", metavar="DIR",
                   help="the site's directory, created, its files replaced (no default: publish writes only what "
                        "--output and --chart name, and refuses a call that names neither)")
    p.add_argument("--chart", metavar="PATH", help="the at-a-glance chart as an SVG image (docs/glance.svg, which the "
                                                   "README and docs/results.md show)")
    p.add_argument("--citation", default=str(CHECKOUT / "CITATION.cff"),
                   help="the citation file whose BibTeX the cite page shows (default: this checkout's)")
    p.set_defaults(func=_cmd_publish)
