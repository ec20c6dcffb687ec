"""What speedlib's checkpoint pays for watching a segment's own generators and forward hooks.

One SGD training step of DenseNet-BC (depth 100, k=12) with speedlib's checkpoint on every
bottleneck, in three variants taking turns in one process (the order rotated each round): as
shipped; without the generator watch; without it and the hook watch. Prints the median
per-round ratio shipped / variant. Usage: python3 tools/checkpoint_watch_cost.py BATCH ROUNDS
(docs/techniques/checkpoint.md gives the figures; measure on an idle machine).
"""

import contextlib
import statistics
import sys
import time

import torch

import speedlib.checkpoint as ck
from speedbench.measure import workloads


class Unwatched:
    """Stands in for GeneratorLog and HookLog: watches nothing, replays nothing."""

    given = False

    def __init__(self, *args):
        pass

    def watched(self):
        return contextlib.nullcontext()

    replayed = watching = quiet = watched


def main(batch: int, rounds: int) -> None:
    workload = workloads.densenet_bc("small", efficient=True).with_batch(batch)
    model = workload.model()
    x, y = workload.batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    variants = {"shipped": (ck.GeneratorLog, ck.HookLog), "no generator watch": (Unwatched, ck.HookLog),
                "neither": (Unwatched, Unwatched)}

    def step(name: str) -> float:
        ck.GeneratorLog, ck.HookLog = variants[name]
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
    for name in names[1:]:
        ratios = [a / b for a, b in zip(times["shipped"], times[name], strict=True)]
        print(f"shipped / {name}: median {statistics.median(ratios):.4f} "
              f"(min {min(ratios):.4f}, max {max(ratios):.4f}), batch {batch}, N={rounds}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
