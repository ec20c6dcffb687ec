"""`speedlib merge`: its arguments, description and exit statuses; the merge itself is
speedbench.results.merge."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_STATUS = """exit status:
  0  merged (or nothing to add: the tree already held everything); one line per change
  1  refused, nothing written: a benchmark of one version measured twice for one
     machine, commit and environment with different values, or a gpu-tests file with two
     contents (without --prefer newer), or hardware that differs under one machine name
     (always refused); one line per conflict
  2  refused, nothing written: a missing or unreadable input, an archive with unsafe or
     repeated members (absolute paths, '..', links, devices) or a failing checksum, a torn
     file, a file whose name its content contradicts, a machine name --machine refuses,
     a target with a file where a directory goes, a full disk, another run or merge
     holding the results directory, or a slot rehearsed without a GPU (without --rehearsal)"""


DESCRIPTION = """Merge results from several hosts into one results tree. Result files of one machine, commit and
environment are merged benchmark by benchmark in asv's format; environment records and chunk
times are appended line by line; gpu-tests files are taken whole. benchmarks.json follows the
newest listing (the one whose results started last), entries of older listings kept where the
newer has none; results of other versions stay, marked where shown. Identical entries merge
silently, so merging twice changes nothing. A benchmark of one version measured twice with
different values (or a gpu-tests file with two contents) is refused, or with --prefer newer
the one that started later is kept and the other written whole into merge-displaced.jsonl.
Hardware that differs under one machine name is always refused. Files are written in full
aside, then renamed under a journal: a stopped merge is finished by the next one."""


def add_parser(sub) -> None:
    """The `merge` subcommand on `speedlib`'s subparsers."""
    p = sub.add_parser("merge", help="merge archives of `speedlib run --archive` and results trees into one results "
                                     "tree, benchmark by benchmark", description=DESCRIPTION,
                       epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", metavar="ARCHIVE_OR_DIR",
                   help="a .tar.gz made by speedlib run --archive, or a results directory")
    p.add_argument("--into", default="results", metavar="DIR", help="the results tree to merge into (default: results)")
    p.add_argument("--rehearsal", action="store_true",
                   help="merge a slot rehearsed without a GPU too (refused by default: its verdict says so)")
    p.add_argument("--prefer", choices=["newer"],
                   help="resolve a benchmark measured twice with different data: keep the entry that started later, "
                        "and write the other whole into merge-displaced.jsonl (default: refuse)")
    p.set_defaults(func=_cmd_merge)


def _cmd_merge(args, argv) -> int:
    from speedbench.results.merge import MergeError, merge  # noqa: PLC0415 - the tree's readers load when it runs

    try:
        lines = merge([Path(s) for s in args.sources], Path(args.into), args.prefer, args.rehearsal)
    except MergeError as e:
        for line in e.lines:
            print(f"speedlib merge: {line}", file=sys.stderr)
        return e.status
    for line in lines:
        print(f"speedlib merge: {line}")
    return 0
