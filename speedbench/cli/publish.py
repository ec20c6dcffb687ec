"""`speedlib publish --output DIR`: the results as a static site (speedbench.report.site); `--chart PATH`:
the at-a-glance chart as an SVG image (the README's and docs/results.md's).

Both are outputs a user names, checked before the results load by the one output rule
(speedbench.results.outputs): never among a results tree's files, a device or FIFO written in
place, the site built beside DIR and renamed into place whole (a full disk leaves the old site or
none, never part of one), an existing DIR replaced only where it holds the site's files alone."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from speedbench import CHECKOUT
from speedbench.cli import report
from speedbench.results.common import printable

DEFAULT_CITATION = str(CHECKOUT / "CITATION.cff")  # this checkout's

EXIT_STATUS = """exit status:
  0  written: the site under --output, the image at --chart
  1  no measured results under --results: nothing written
  2  refused before anything was written (one line says why): neither --output nor --chart given,
     no results directory, an --output or --chart that cannot take what publish writes there, a
     --citation that cannot be read; or nothing was written because the disk filled (the old site
     and chart are as they were)"""


def _say(text: str) -> None:
    print(f"speedlib publish: {text}", file=sys.stderr)


def _citation(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(the citation file's text or None, why it cannot be read or None): the default file may
    be missing (no BibTeX then); one named with --citation must be readable UTF-8."""
    path = Path(args.citation or DEFAULT_CITATION)
    if args.citation is None and not path.is_file():
        return None, None
    try:
        return path.read_bytes().decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"--citation {printable(str(path))} is not UTF-8 text (byte {e.start}): save it as UTF-8"
    except OSError as e:
        return None, f"--citation {printable(str(path))} cannot be read: {e.strerror or e}"


def _cmd_publish(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if not (args.output or args.chart):
        _say("say what to write: --output DIR (the site), --chart PATH (the chart's image), or both")
        return 2
    from speedbench.report import site  # noqa: PLC0415 - pandas and plotly; `speedlib --help` loads none
    from speedbench.results import outputs  # noqa: PLC0415 - with the loader, when the command runs
    from speedbench.results.atomic import disk_full  # noqa: PLC0415 - as above
    from speedbench.results.load import load_results  # noqa: PLC0415 - pandas; `speedlib --help` loads none

    results = Path(args.results)
    if not results.is_dir():
        _say(f"no results directory at {printable(str(results))}")
        return 2
    cff_text, unreadable = _citation(args) if args.output else (None, None)
    if unreadable:
        _say(unreadable)
        return 2
    known = set(site.names())
    try:  # every output checked before the results load
        if args.chart:
            outputs.file_output(args.chart, "--chart", [results])
        if args.output:
            outputs.directory_output(args.output, "--output", [results], writes=lambda n, d: n in known and not d)
    except outputs.OutputRefused as e:
        _say(str(e))
        return 2
    df = load_results(results).measured
    if df.empty:
        _say(f"no measured results under {printable(str(results))}")
        return 1
    for option, path, write in (("--chart", args.chart, lambda: _write_chart(site, outputs, df, Path(args.chart))),
                                ("--output", args.output, lambda: _write_site(site, outputs, df, cff_text,
                                                                              Path(args.output)))):
        if not path:
            continue
        try:
            said = write()
        except OSError as e:
            _say(f"could not write {option} {printable(str(path))} ({e.strerror or e}{disk_full(e)}): nothing "
                 "half-written is left there, what was there before is as it was")
            return 2
        print(f"speedlib publish: {said}")
    return 0


def _write_chart(site, outputs, df, path: Path) -> str:
    with outputs.written(path) as f:
        f.write(site.chart(df).encode("utf-8"))
    return f"the at-a-glance chart in {printable(str(path))}"


def _write_site(site, outputs, df, cff_text: str | None, path: Path) -> str:
    written = site.pages(df, cff_text)
    with outputs.built_whole(path) as new:
        for name, text in written.items():
            (new / name).write_text(text, encoding="utf-8")
    return f"{len(written)} files in {printable(str(path))}; open index.html"


def add_parser(sub) -> None:
    p = sub.add_parser("publish", help="write the results as a static site (no server, no network)",
                       description="Write the results as a static site (the dashboard's pages as HTML files that "
                                   "open from file://) and/or the at-a-glance chart as an SVG image.",
                       epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=report.RESULTS,
                   help="results directory (default: this checkout's results/, as `speedlib report`)")
    p.add_argument("--output", "-o", metavar="DIR",
                   help="the site's directory (made if missing; an existing one is replaced whole only where it holds "
                        "a site's files alone; no default: publish writes only what --output and --chart name)")
    p.add_argument("--chart", metavar="PATH", help="the at-a-glance chart as an SVG image (docs/glance.svg, which the "
                                                   "README and docs/results.md show)")
    p.add_argument("--citation", default=None, help="the citation file whose BibTeX the cite page shows (default: "
                                                    "this checkout's CITATION.cff, where there is one)")
    p.set_defaults(func=_cmd_publish)
