"""`speedlib versions`: does each benchmark still measure what its version was recorded with
(benchmarks/versions.json, speedbench.run.ledger)? `--bump` and `--same` record a change."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from speedbench.results.common import printable


def _cmd_versions(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from speedbench.results.tree import ResultsError  # noqa: PLC0415 - kept out of `speedlib --help`, like all work
    from speedbench.run import ledger  # noqa: PLC0415 - as above
    from speedbench.run.checkout import find_root  # noqa: PLC0415 - as above
    from speedbench.run.errors import SuiteError  # noqa: PLC0415 - as above

    try:
        root = find_root()
        if args.bump is not None or args.same is not None:
            if args.why is None:
                raise ledger.LedgerError("say why (--why TEXT): the ledger keeps it beside the version")
            names = args.bump if args.bump is not None else args.same
            said = ledger.record(root, [n for n in names if n], args.why, bump=args.bump is not None, at=args.at)
            for line in said or ["nothing to record: every benchmark measures what its version was recorded with"]:
                print(f"speedlib versions: {line}")
            return 0
        if args.recover is not None:
            from speedbench.run import recover  # noqa: PLC0415 - as above

            found = recover.recover(root, [Path(d) for d in args.recover or ["results"]],
                                    say=lambda line: print(f"speedlib versions: {line}", flush=True))
            print(f"speedlib versions: {sum(found.rewritten.values())} result(s) in {len(found.rewritten)} file(s) "
                  "now carry the version they measure")
            for why, n in sorted(found.kept.items()):
                print(f"speedlib versions: {n} result(s) kept as they were: {why}")
            return 0
        findings = ledger.check(root)
    except (ledger.LedgerError, ledger.FingerprintError, SuiteError, ResultsError, OSError) as e:
        print(f"speedlib versions: {printable(str(e))}", file=sys.stderr)
        return 2
    print(ledger.describe(findings))
    return 0 if all(f.ok for f in findings) else 1


def add_parser(sub) -> None:
    p = sub.add_parser(
        "versions", help="check that each benchmark measures what its version says (benchmarks/versions.json)",
        description="Exit status: 0 every benchmark class measures with the code its version was recorded with; "
                    "1 some do not (each named, with the code that changed); 2 a refusal (one line).")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--bump", nargs="*", metavar="BENCHMARK",
                      help="what these (module.Class; none: every one the check names) measure has changed: set the "
                           "next version in the class and the ledger, so older results are no longer compared")
    what.add_argument("--same", nargs="*", metavar="BENCHMARK",
                      help="their code changed but what they measure did not: the current version accepts it")
    p.add_argument("--at", metavar="COMMIT", help="with --same: the code judged the same is this commit's, not the "
                                                  "checkout's (older results measured with it can then be recovered)")
    p.add_argument("--why", metavar="TEXT", help="one line the ledger keeps with the change (needed by --bump, --same)")
    what.add_argument("--recover", nargs="*", metavar="RESULTS",
                      help="rewrite the results in these trees (default: results) whose asv-hash version the ledger "
                           "accepts to the version they measure, and list them in the ledger")
    p.set_defaults(func=_cmd_versions)

