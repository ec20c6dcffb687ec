"""How a run refuses and ends: `SuiteError` for a precondition it refuses, the exit statuses
`speedlib run` and `speedlib slot` share, and the one-line refusal when torch is missing."""

from __future__ import annotations

import importlib.util
import sys


class SuiteError(RuntimeError):
    """A `speedlib run` precondition failed; the message says how to fix it."""


# Not 2 (the run stopped early), so that a script can tell that the run finished and its
# results and archive are there to collect.
BENCHMARKS_FAILED = 3
CHUNKS_LEFT = 4


def missing_torch(command: str) -> bool:
    """Measuring needs torch; viewing results does not, so a viewer-only install (the
    README's first command) has none. Say so in one line instead of a traceback."""
    if importlib.util.find_spec("torch") is not None:
        return False
    print(f"speedlib {command}: PyTorch is not installed, and measuring needs it: "
          'python3 -m pip install -e ".[bench]" (report and dashboard work without it)', file=sys.stderr)
    return True
