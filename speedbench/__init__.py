"""speedbench: the harness that measures speedlib's techniques (the `speedlib` command).

Kept apart from the library so that:
- a commit walk (`speedlib run --commits A..B`) measures every commit's techniques
  (`speedlib/` at that commit) with this checkout's timers, memory counters, workloads and
  benchmarks, and a harness change never shows up as a technique's regression;
- `import speedlib` in a training script needs torch alone;
- viewing results (`results`, `report`, `plan`, `cli`, the dashboard) imports no torch:
  only `measure`, `workloads` and `suite`'s runs do.
"""

from pathlib import Path

# The checkout this harness is part of: benchmarks/, dashboard/ and results/ sit beside it.
CHECKOUT = Path(__file__).resolve().parent.parent
