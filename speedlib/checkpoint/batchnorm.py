"""BatchNorm that updates its running statistics once per step under checkpointing.

Every checkpoint reruns a segment's forward in backward, and a plain `nn.BatchNorm*d`
would update its running statistics on both runs. `in_backward()` tells the rerun apart;
speedlib's `BatchNorm1d/2d/3d` skip the update there, and `convert_batchnorm(model)` swaps
them into an existing model. They work with any checkpoint (torch's too), so they live apart
from speedlib/checkpoint/recompute.py; the classes name `speedlib.checkpoint` as their module,
so `torch.save(model)` pickles them under the name users import them by.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def in_backward() -> bool:
    """True while this thread runs part of an autograd backward pass (where checkpoints rerun)."""
    # torch.utils.checkpoint relies on the same call (-1 outside backward); there is no
    # public equivalent. Checked by tests, so a torch that drops it fails loudly.
    return torch._C._current_graph_task_id() != -1


# --- BatchNorm that updates its statistics once per step -----------------------------------

class _OnceBatchNorm:
    """Mixin for nn.BatchNorm*d: no running-statistics update when rerun in backward."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.track_running_stats and in_backward()):
            return super().forward(input)
        self._check_input_dim(input)
        # A rerun: normalise with the batch's statistics exactly as the first run did (the
        # same kernel, hence scratch copies of the running buffers rather than None), and
        # throw the update away. num_batches_tracked is left alone too.
        return F.batch_norm(input, self.running_mean.clone(), self.running_var.clone(), self.weight, self.bias,
                            True, 0.0 if self.momentum is None else self.momentum, self.eps)


class BatchNorm1d(_OnceBatchNorm, nn.BatchNorm1d):
    """nn.BatchNorm1d whose running statistics see each training step once under checkpointing."""

    __module__ = "speedlib.checkpoint"  # its public home: torch.save(model) pickles it by this name


class BatchNorm2d(_OnceBatchNorm, nn.BatchNorm2d):
    """nn.BatchNorm2d whose running statistics see each training step once under checkpointing."""

    __module__ = "speedlib.checkpoint"  # its public home: torch.save(model) pickles it by this name


class BatchNorm3d(_OnceBatchNorm, nn.BatchNorm3d):
    """nn.BatchNorm3d whose running statistics see each training step once under checkpointing."""

    __module__ = "speedlib.checkpoint"  # its public home: torch.save(model) pickles it by this name


_SWAP = {nn.BatchNorm1d: BatchNorm1d, nn.BatchNorm2d: BatchNorm2d, nn.BatchNorm3d: BatchNorm3d}


def convert_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every plain nn.BatchNorm1d/2d/3d in `module` (in place) by speedlib's.

    Parameters and buffers are the same objects, so optimizers, state_dicts and flat
    buffers built before the call stay valid. Returns `module` (or the replacement when
    `module` is itself a BatchNorm).
    """
    swap = _SWAP.get(type(module))
    if swap is not None:
        module.__class__ = swap  # same attributes, new forward: no copy, nothing re-registered
        return module
    for child in module.children():
        convert_batchnorm(child)
    return module
