"""The DDP / DataParallel / one-process launcher the benchmarks and tests measure with.

    result = run(RunConfig(mode="ddp", world_size=2, workload="mlp", batch=64))
    result.step_seconds, result.samples_per_second, result.state_dict

It trains one standard workload (speedbench.measure.workloads) for a few timed steps in one of
speedlib.parallel's modes, wrapped by `speedlib.parallel.wrap` and stepped by
`speedlib.tuning.accumulation_step`, so what it times is the library's code. The model, the
global batch and the optimizer are the same in every mode; only how the batch is spread
changes, so the modes can be compared for speed and for equality.

DistributedDataParallel runs on PyTorch's own engine: `run(..., launcher="torchrun")` goes
through `torch.distributed.run`, `launcher="mp"` through `torch.multiprocessing` (spawn).
More nodes need no other code, only torchrun's rendezvous on every node:

    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \\
             --rdzv-endpoint=HOST:29500 --rdzv-id=speedlib \\
             -m speedbench.measure.ddp_launch --config '{"mode": "ddp", "world_size": 16, ...}' --out run.json

A rank that raises, dies or hangs ends the whole run with RunFailed (or RunTimedOut after
`timeout` seconds) naming the rank; every worker process is gone when `run` returns.
Per-rank step times are gathered to rank 0, and the slowest rank sets the step time.
Faults are injected on request, to test that handling.

It lives in the harness, not in speedlib, because it measures: a commit walk takes it from
the checkout and the technique (wrap, accumulation_step) from each commit. A plain-PyTorch
baseline runs through the same timing loop with a `Recipe` of its own, written with torch
alone in its benchmark (benchmarks/bench_parallel.py): `run(config, recipe=...)`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from speedbench.measure import instruments, workloads
from speedlib import tuning
from speedlib.contiguous import ContiguousParams
from speedlib.parallel import MODES, wrap

__all__ = ["MODES", "FAULTS", "Recipe", "LIBRARY", "RunConfig", "RunResult", "RunFailed", "RunTimedOut", "run",
           "main"]

FAULTS = ("raise", "kill", "hang")  # injected into one rank, to test the failure handling
_INT_FIELDS = ("world_size", "batch", "steps", "warmup", "micro_batches", "seed", "fault_rank", "fault_step")


@dataclass(frozen=True)
class RunConfig:
    mode: str = "ddp"
    world_size: int = 1  # processes (ddp) or devices (dataparallel); 1 for single
    workload: str = "mlp"
    batch: int = 64  # the global batch of one optimizer step
    steps: int = 10  # timed steps, after `warmup` untimed ones
    warmup: int = 2
    micro_batches: int = 1  # gradient accumulation inside each step
    no_sync: bool = True  # skip the all-reduce on all but the last micro-batch
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    contiguous: bool = False  # the optimizer steps speedlib.ContiguousParams' flat buffers
    checkpoint: str = "none"  # a speedbench.measure.workloads.CHECKPOINT_VARIANTS entry (DenseNets, transformer)
    device: str = "cpu"  # "cpu" or "cuda"
    lr: float = 0.01
    seed: int = 0
    count_allreduces: bool = False  # count DDP's bucket all-reduces with a comm hook
    fault: str | None = None
    fault_rank: int = 1
    fault_step: int = 1

    def __post_init__(self):
        for name in _INT_FIELDS:  # JSON configs and typos: "2" would fail later in a raw comparison
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {MODES}")
        if self.workload not in workloads.WORKLOADS:  # else found out in every rank, after the launch
            raise ValueError(f"unknown workload {self.workload!r}; choose one of {sorted(workloads.WORKLOADS)}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not (math.isfinite(self.lr)
                                                                                       and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.world_size < 1 or (self.mode == "single" and self.world_size != 1):
            raise ValueError(f"world_size must be >= 1 (and 1 for single), got {self.world_size}")
        if self.mode == "dataparallel" and self.device != "cuda":
            raise ValueError("DataParallel splits a batch over CUDA devices; on CPU it would just call the module")
        if self.batch < 1 or self.micro_batches < 1:
            which = "batch" if self.batch < 1 else "micro_batches"
            raise ValueError(f"{which} must be >= 1, got {getattr(self, which)}")
        if self.batch % (self.world_size * self.micro_batches):
            raise ValueError(f"batch {self.batch} must split evenly into {self.world_size} ranks x "
                             f"{self.micro_batches} micro-batches (unequal shards would weight samples unequally)")
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"need steps >= 1 and warmup >= 0, got {self.steps}, {self.warmup}")
        if self.checkpoint not in workloads.CHECKPOINT_VARIANTS:
            raise ValueError(f"unknown checkpoint variant {self.checkpoint!r}; "
                             f"choose one of {workloads.CHECKPOINT_VARIANTS}")
        if self.fault is not None:
            self._check_fault()

    def _check_fault(self) -> None:
        # A fault aimed at a rank or step that never runs would let the whole job finish,
        # and a test of the failure handling pass without anything having failed.
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; choose one of {FAULTS}")
        if self.mode != "ddp":
            raise ValueError("faults are injected into DDP ranks only")
        if not 0 <= self.fault_rank < self.world_size:
            raise ValueError(f"fault_rank must be one of the {self.world_size} ranks (0 to {self.world_size - 1}), "
                             f"got {self.fault_rank}")
        total = self.warmup + self.steps
        if not 0 <= self.fault_step < total:
            raise ValueError(f"fault_step must be one of the {total} steps (0 to {total - 1}, the {self.warmup} "
                             f"warmup steps first), got {self.fault_step}")

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


@dataclass
class RunResult:
    config: RunConfig
    step_times: list[list[float]]  # [rank][step], seconds, timed steps only
    allreduces: list[int] | None  # per rank, over the timed steps (count_allreduces)
    losses: list[float]  # rank 0's loss per timed step (its shard's mean)
    state_dict: dict[str, torch.Tensor] = field(repr=False)

    @property
    def step_seconds(self) -> float:
        """Median over steps of the slowest rank's time: a step ends when every rank is done."""
        return statistics.median(max(ranks) for ranks in zip(*self.step_times, strict=True))

    @property
    def samples_per_second(self) -> float:
        return self.config.batch / self.step_seconds


class RunFailed(RuntimeError):
    """A rank raised, died or hung; the message says which and why."""

    def __init__(self, message: str, pids: list[int] | None = None):
        super().__init__(message)
        self.pids = pids or []


class RunTimedOut(RunFailed, TimeoutError):
    """The run did not finish in time (typically a rank hung); every worker was killed."""


# --- one rank ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recipe:
    """How a rank builds, wraps and steps its model; everything else (the batch, its shards,
    the optimizer, the timing) is the launcher's, the same for every recipe. Spawned ranks
    unpickle it, so its functions must be importable module-level names.

      model(config, device) -> nn.Module   initial weights from config.seed
      wrap(model, mode, device_ids, **ddp_options), as speedlib.parallel.wrap
      step(model, optimizer, loss_fn, x, y, micro_batches, no_sync) -> loss,
                                           as speedlib.tuning.accumulation_step
    """

    model: Callable
    wrap: Callable
    step: Callable


def _workload_model(config: RunConfig, dev: torch.device) -> nn.Module:
    """The workload's model, with the commit's checkpointing where the config asks for it."""
    model = workloads.get(config.workload, dev).model(dev, seed=config.seed)  # the same initial weights on every rank
    if config.checkpoint != "none":
        workloads.set_checkpointing(model, config.checkpoint)
    return model


# The library's recipe, the default: what the commit under test does.
LIBRARY = Recipe(_workload_model, wrap, tuning.accumulation_step)


def _device(config: RunConfig, local_rank: int) -> torch.device:
    if config.device == "cpu":
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _count_allreduces(model: nn.parallel.DistributedDataParallel, counter: list[int]) -> None:
    def hook(state, bucket):
        counter[0] += 1
        return default_hooks.allreduce_hook(None, bucket)

    model.register_comm_hook(None, hook)


def _inject(config: RunConfig, rank: int, step: int) -> None:
    if config.fault is None or rank != config.fault_rank or step != config.fault_step:
        return
    if config.fault == "raise":
        raise RuntimeError(f"fault injected on rank {rank} at step {step}")
    if config.fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10**6)  # "hang": as a rank stuck in I/O or a deadlock would


def train(config: RunConfig, rank: int = 0, local_rank: int = 0, recipe: Recipe = LIBRARY) -> dict:
    """This rank's part of the run (the process group, if any, is already up)."""
    if config.contiguous and recipe != LIBRARY:
        raise ValueError("contiguous=True steps speedlib's flat buffers: it has no place in another recipe")
    dev = _device(config, local_rank)
    world = config.world_size if config.mode == "ddp" else 1
    wl = workloads.get(config.workload, dev).with_batch(config.batch)
    model = recipe.model(config, dev)
    x, y = wl.batch("cpu", seed=config.seed)  # the global batch; each rank takes its shard
    x, y = x.tensor_split(world)[rank].to(dev), y.tensor_split(world)[rank].to(dev)
    flat = None
    if config.contiguous:  # after .to(device), before DDP wraps the model
        flat = ContiguousParams(model.parameters())
    counter = [0]
    if config.mode == "ddp":
        wrapped = recipe.wrap(model, "ddp", [local_rank] if dev.type == "cuda" else None,
                              gradient_as_bucket_view=config.gradient_as_bucket_view,
                              static_graph=config.static_graph, find_unused_parameters=config.find_unused_parameters)
        if config.count_allreduces:
            _count_allreduces(wrapped, counter)
    else:  # the DDP options have nothing to configure here (RunConfig keeps them for every mode)
        wrapped = recipe.wrap(model, config.mode,
                              list(range(config.world_size)) if config.mode == "dataparallel" else None)
    optimizer = torch.optim.SGD(flat.contiguous() if flat else model.parameters(), lr=config.lr, momentum=0.9)
    times, losses = [], []
    for step in range(config.warmup + config.steps):
        _inject(config, rank, step)
        if step == config.warmup:
            counter[0] = 0
        instruments.synchronize(dev)
        start = time.perf_counter()
        loss = recipe.step(wrapped, optimizer, wl.loss, x, y, config.micro_batches, config.no_sync)
        instruments.synchronize(dev)
        if step >= config.warmup:
            times.append(time.perf_counter() - start)
            losses.append(loss)
    return {"rank": rank, "step_times": times, "allreduces": counter[0] if config.count_allreduces else None,
            "losses": [float(v) for v in losses], "state_dict": {k: v.cpu() for k, v in model.state_dict().items()}}


def _distributed_rank(config: RunConfig, rank: int, local_rank: int, init_method: str, out_dir: str,
                      recipe: Recipe = LIBRARY) -> None:
    """Join the process group, train, gather every rank's times to rank 0, which writes them."""
    if config.device == "cpu":  # ranks on one host share its cores instead of oversubscribing them
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", config.world_size))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group(config.backend, init_method=init_method, rank=rank, world_size=config.world_size,
                            timeout=datetime.timedelta(minutes=10))
    try:
        mine = train(config, rank, local_rank, recipe)
        state = mine.pop("state_dict")
        everyone = [None] * config.world_size if rank == 0 else None
        dist.gather_object(mine, everyone, dst=0)
        if rank == 0:
            torch.save(state, Path(out_dir, "state.pt"))
            Path(out_dir, "ranks.json").write_text(json.dumps(everyone))
    finally:
        dist.destroy_process_group()


def _mp_entry(local_rank: int, config_json: str, init_method: str, out_dir: str, recipe: Recipe = LIBRARY) -> None:
    _distributed_rank(RunConfig(**json.loads(config_json)), local_rank, local_rank, init_method, out_dir, recipe)


# --- launchers -----------------------------------------------------------------------------

def _check_devices(config: RunConfig) -> None:
    if config.device == "cuda":
        have = torch.cuda.device_count()
        need = config.world_size if config.mode != "single" else 1
        if have < need:
            raise ValueError(f"{config.mode} with world_size {config.world_size} needs {need} CUDA devices; "
                             f"this machine has {have}")


def _result(config: RunConfig, out_dir: str) -> RunResult:
    ranks = sorted(json.loads(Path(out_dir, "ranks.json").read_text()), key=lambda r: r["rank"])
    state = torch.load(Path(out_dir, "state.pt"), weights_only=True)
    counts = [r["allreduces"] for r in ranks]
    return RunResult(config, [r["step_times"] for r in ranks], None if counts[0] is None else counts,
                     ranks[0]["losses"], state)


def _run_mp(config: RunConfig, out_dir: str, timeout: float, recipe: Recipe = LIBRARY) -> None:
    init = f"file://{Path(out_dir, 'rendezvous')}"
    ctx = mp.start_processes(_mp_entry, args=(json.dumps(dataclasses.asdict(config)), init, out_dir, recipe),
                             nprocs=config.world_size, join=False, start_method="spawn")
    pids = list(ctx.pids())
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=0.2):  # join() raises as soon as one rank fails, after stopping the rest
            if time.monotonic() > deadline:
                alive = [rank for rank, p in enumerate(ctx.processes) if p.is_alive()]
                raise RunTimedOut(f"the DDP run did not finish within {timeout:.0f} s; ranks {alive} were still "
                                  "running (a hung rank, or peers waiting for it in a collective) and were killed",
                                  pids)
    except mp.ProcessRaisedException as e:
        raise RunFailed(f"rank {e.error_index} raised:\n{e}", pids) from None
    except mp.ProcessExitedException as e:
        raise RunFailed(f"rank {e.error_index} died: {e}", pids) from None
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()


def torchrun_command(config: RunConfig, out_dir: str) -> list[str]:
    """The single-node torchrun command for `config` (what `run(..., launcher="torchrun")` runs)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={config.world_size}",
            "--max-restarts=0", "-m", "speedbench.measure.ddp_launch",
            "--config", json.dumps(dataclasses.asdict(config)), "--out", out_dir]


def _kill_workers_of(out_dir: str) -> None:
    """SIGKILL every process whose command line names `out_dir`: torchrun starts each worker
    in a session of its own, so killing torchrun's process group does not reach them."""
    if not os.path.isdir("/proc"):
        return
    needle = out_dir.encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue  # gone already, or not ours to read


def _run_torchrun(config: RunConfig, out_dir: str, timeout: float) -> None:
    with open(Path(out_dir, "torchrun.log"), "w+", encoding="utf-8") as log:
        proc = subprocess.Popen(torchrun_command(config, out_dir), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM first: torchrun's agent then stops its workers itself; whatever is
            # left after a grace period is killed.
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            raise RunTimedOut(f"torchrun did not finish within {timeout:.0f} s; it and all its workers were killed",
                              [proc.pid]) from None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _kill_workers_of(out_dir)
        if code != 0:
            log.seek(0)
            tail = "".join(log.readlines()[-25:])
            raise RunFailed(f"torchrun exited with status {code}; the end of its output:\n{tail}", [proc.pid])


def run(config: RunConfig, *, launcher: str = "mp", timeout: float = 600.0, recipe: Recipe = LIBRARY) -> RunResult:
    """Run `config` and collect every rank's results (see the module docstring).

    single and dataparallel run in this process; ddp in `world_size` new processes through
    `launcher` ("mp": torch.multiprocessing spawn; "torchrun": torch.distributed.run).
    recipe: how the ranks build, wrap and step the model (`Recipe`); speedlib's by default.
    """
    if launcher not in ("mp", "torchrun"):
        raise ValueError(f"launcher must be 'mp' or 'torchrun', got {launcher!r}")
    if launcher == "torchrun" and recipe != LIBRARY:  # its workers read a JSON config, nothing else
        raise ValueError("a recipe other than speedlib's runs with launcher='mp'")
    _check_devices(config)
    if config.mode != "ddp":  # RunConfig refuses a fault outside DDP
        out = train(config, recipe=recipe)
        return RunResult(config, [out["step_times"]], None, out["losses"], out["state_dict"])
    with tempfile.TemporaryDirectory(prefix="speedlib-ddp-") as out_dir:
        if launcher == "mp":
            _run_mp(config, out_dir, timeout, recipe)
        else:
            _run_torchrun(config, out_dir, timeout)
        return _result(config, out_dir)


def main(argv: list[str] | None = None) -> None:
    """Entry point of a torchrun worker: `torchrun ... -m speedbench.measure.ddp_launch --config JSON --out DIR`."""
    parser = argparse.ArgumentParser(prog="python -m speedbench.measure.ddp_launch", description=main.__doc__)
    parser.add_argument("--config", required=True, help="RunConfig fields as a JSON object")
    parser.add_argument("--out", required=True, help="directory where rank 0 writes ranks.json and state.pt")
    args = parser.parse_args(argv)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            parser.error(f"${var} is not set: start this module with torchrun, not directly")
    config = RunConfig(**json.loads(args.config))
    if int(os.environ["WORLD_SIZE"]) != config.world_size:
        parser.error(f"torchrun started {os.environ['WORLD_SIZE']} processes but the config says "
                     f"world_size {config.world_size}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    _distributed_rank(config, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), "env://", args.out)


if __name__ == "__main__":
    main()
