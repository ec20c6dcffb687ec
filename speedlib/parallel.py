"""One training model three ways: one process, nn.DataParallel, DistributedDataParallel.

    model = parallel.wrap(model, "ddp", device_ids=[local_rank])
    loss = tuning.accumulation_step(model, optimizer, loss_fn, x, y, micro_batches=4)

The model, the global batch and the optimizer are the same in every mode; only how the
batch is spread changes, so the modes give the same training (tests/test_parallel.py):

  single        one process, one device, the whole batch: the model itself
  dataparallel  one process, `nn.DataParallel` over `device_ids`: every step scatters the
                batch, replicates the module, gathers the outputs, and one Python thread
                per device fights over the GIL
  ddp           one process per device (started by torchrun), each with its shard of the
                batch, gradients all-reduced in buckets during backward

Gradient accumulation under DDP is `speedlib.tuning.accumulation_step`: it runs all but the
last micro-batch in `no_sync()`, so gradients are all-reduced once per optimizer step.

This module is what a training script calls. The launcher that runs a workload in each
mode and times it (process groups, torchrun or torch.multiprocessing, failing ranks) is
part of the benchmark harness, `speedbench.measure.ddp_launch`, so that the library never imports
the harness.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

__all__ = ["MODES", "wrap"]

MODES = ("single", "dataparallel", "ddp")


def wrap(model: nn.Module, mode: str, device_ids: Sequence[int] | None = None, *,
         gradient_as_bucket_view: bool = False, static_graph: bool = False,
         find_unused_parameters: bool = False) -> nn.Module:
    """`model` as `mode` trains it; the returned module is what forward and backward call.

    Build the optimizer on `model.parameters()` (or its flat buffers), not on the wrapper's:
    the parameters are the same tensors. "ddp" needs the process group to be up already and
    `model` on this rank's device; `device_ids` is `[local_rank]` on CUDA and None on CPU
    (gloo). "dataparallel" spreads each batch over `device_ids` (all visible GPUs if None).
    The keyword options are DDP's own and are refused for the other modes, where they would
    silently do nothing.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    if mode != "ddp" and (gradient_as_bucket_view or static_graph or find_unused_parameters):
        raise ValueError(f"gradient_as_bucket_view, static_graph and find_unused_parameters are DDP options; "
                         f"mode {mode!r} has no buckets to configure")
    if mode == "single":
        return model
    if mode == "dataparallel":
        return nn.DataParallel(model, device_ids=None if device_ids is None else list(device_ids))
    return nn.parallel.DistributedDataParallel(
        model, device_ids=None if device_ids is None else list(device_ids),
        gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph,
        find_unused_parameters=find_unused_parameters)
