"""`speedlib slot`: its arguments and exit statuses; the slot itself is speedbench.run.slot."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from speedbench.results.common import printable
from speedbench.run import slot
from speedbench.run.errors import BENCHMARKS_FAILED, CHUNKS_LEFT, missing_torch, settings_refused

DESCRIPTION = slot.__doc__.split("\n\n")[0] + """

Runs the GPU-only tests (python3 -m pytest -m gpu), keeps their verdict in
results/<machine>/gpu-tests/<commit8>.json, then the headline chunks, then the other chunks
under the time left, each chunk archived as it finishes; one archive in the end, which
`speedlib merge` takes. Offline hosts: docs/gpu-slots.md."""

EXIT_STATUS = """exit status:
  0  the GPU tests passed, every chunk ran and no benchmark failed
  2  the slot could not start (the message says why: no asv or pytest, a dirty checkout, ...)
  3  some benchmarks failed (listed); everything else was written and archived
  4  chunks were left for a later command (listed, with the command to run them)
  5  GPU tests failed or did not finish (their verdict is recorded and archived; the suite ran)
  130, 143  stopped by Ctrl+C or SIGTERM: what was archived so far is kept"""


def add_parser(sub) -> None:
    """The `slot` subcommand on `speedlib`'s subparsers."""
    p = sub.add_parser("slot", help="a short GPU slot in one command: the GPU tests, the headline chunks, then the "
                                    "others under the time left, all in one archive",
                       description=DESCRIPTION, epilog=EXIT_STATUS,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archive", required=True, metavar="FILE.tar.gz",
                   help="the archive to carry off the machine (rewritten after the tests and after every chunk)")
    p.add_argument("--machine", help="asv machine name (default: from the hardware, e.g. h200-141gb)")
    p.add_argument("--minutes", default=str(slot.DEFAULT_MINUTES), metavar="M",
                   help=f"the slot's length: the command ends within it (default: {slot.DEFAULT_MINUTES:g})")
    p.add_argument("--results-dir", help="where results go (default: asv.conf.json's results_dir)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run although the checkout has uncommitted changes (tests, library, suite)")
    p.add_argument("--show-stderr", action="store_true", help="show the benchmarks' stderr")
    p.set_defaults(func=_cmd_slot)


def _cmd_slot(args, argv) -> int:
    from speedbench.results.gpu_tests import FAILED, INCOMPLETE, status  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser
    from speedbench.run import suite  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    try:
        minutes = float(args.minutes)
    except ValueError:
        print(f"speedlib slot: --minutes must be a number of minutes above 0 and at most {slot.MAX_MINUTES:g} (a day), "
              f"got {printable(args.minutes)}", file=sys.stderr)
        return 2
    if settings_refused("slot", device=True) or missing_torch("slot"):
        return 2
    if not (math.isfinite(minutes) and 0 < minutes <= slot.MAX_MINUTES):  # before torch loads, said as _check says it
        print(f"speedlib slot: --minutes must be a number of minutes above 0 and at most {slot.MAX_MINUTES:g} (a day), "
              f"got {printable(args.minutes)}", file=sys.stderr)
        return 2
    options = slot.SlotOptions(Path(args.archive), args.machine, minutes,
                          Path(args.results_dir) if args.results_dir else None, args.allow_dirty, args.show_stderr)
    try:
        result = slot.run(options, argv=argv)
    except suite.Interrupted as e:
        print(f"speedlib slot: {e}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        return 130
    except suite.SuiteError as e:
        print(f"speedlib slot: {e}", file=sys.stderr)
        return 2
    if status(result.verdict) in (FAILED, INCOMPLETE):  # suite.run listed failed benchmarks itself
        return slot.GPU_TESTS_FAILED
    if result.failed:
        return BENCHMARKS_FAILED
    return CHUNKS_LEFT if result.left else 0
