"""What speedlib's checkpoint pays for watching a segment's own generators and forward hooks.

One SGD training step of DenseNet-BC (depth 100, k=12) with speedlib's checkpoint on every
bottleneck, in three variants taking turns in one process (the order rotated each round): as
shipped; without the generator watch; without it and the hook watch. Prints the median
per-round ratio shipped / variant. Usage: python3 tools/checkpoint_watch_cost.py BATCH ROUNDS [DEPTH]
(DEPTH 6n + 4, default 100; docs/techniques/checkpoint.md gives the figures; measure on an idle machine).

The watches are built by speedlib/checkpoint/replay.py's Replay, which looks the two classes up
in that module when a checkpoint starts; the variants swap them there. tests/test_tools.py runs
this at a small size, so a change of that layout fails a test instead of this tool.
"""

import contextlib
import statistics
import sys
import time

import torch

from speedbench.measure import workloads
from speedlib.checkpoint import replay


class Unwatched:
    """Stands in for GeneratorLog and HookLog: watches nothing, replays nothing."""

    given = False

    def __init__(self, *args):
        pass

    def watched(self):
        return contextlib.nullcontext()

    replayed = watching = quiet = watched


def main(batch: int, rounds: int, depth: int = 100) -> None:
    workload = workloads.densenet_bc("small", depth=depth, efficient=True).with_batch(batch)
    model = workload.model()
    x, y = workload.batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    variants = {"shipped": (replay.GeneratorLog, replay.HookLog), "no generator watch": (Unwatched, replay.HookLog),
                "neither": (Unwatched, Unwatched)}

    def step(name: str) -> float:
        replay.GeneratorLog, replay.HookLog = variants[name]
        began = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        return time.perf_counter() - began

    names = list(variants)
    for _ in range(2):  # warm-up
        for name in names:
            step(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:
            times[name].append(step(name))
    replay.GeneratorLog, replay.HookLog = variants["shipped"]
    for name in names[1:]:
        ratios = [a / b for a, b in zip(times["shipped"], times[name], strict=True)]
        print(f"shipped / {name}: median {statistics.median(ratios):.4f} "
              f"(min {min(ratios):.4f}, max {max(ratios):.4f}), batch {batch}, depth {depth}, N={rounds}")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or not all(a.isdigit() and int(a) > 0 for a in sys.argv[1:]):
        print("usage: python3 tools/checkpoint_watch_cost.py BATCH ROUNDS [DEPTH] (positive integers)", file=sys.stderr)
        sys.exit(2)
    main(*(int(a) for a in sys.argv[1:]))
