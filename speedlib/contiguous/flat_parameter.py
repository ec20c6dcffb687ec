"""The types the modules of speedlib/contiguous/ share: a flat buffer's slice.

`FlatParameter` (what the optimizer steps), `InvalidBufferError`, and `FlatOwner` (what the hooks of
speedlib/contiguous/hooks.py may ask of the ContiguousParams behind it) live here, below
the others, so that none of them imports another in a circle. `speedlib.contiguous` is the module
to import.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

BASE_GRAD = torch._C.TensorBase.grad  # the C-level .grad descriptor FlatParameter wraps


class InvalidBufferError(ValueError):
    """Parameters or gradients no longer live in the flat buffers.

    A ValueError, as in `contiguous_params`, so existing handlers keep working.
    """

    __module__ = "speedlib.contiguous"  # its public home: tracebacks and pickles name it


class FlatOwner(Protocol):
    """What the process-wide hooks call on the ContiguousParams that made a FlatParameter."""

    def assert_buffer_is_valid(self) -> None: ...

    def reattach_grads(self) -> None: ...

    def _before_accumulate(self, index: int) -> None: ...

    def _mark_replaced(self, module: nn.Module, name: str) -> None: ...


class FlatParameter(nn.Parameter):
    """One parameter group's slice of a flat buffer, as handed to the optimizer.

    Its `.grad` is pinned to the matching slice of the flat gradient buffer: setting it to
    None (what `optimizer.zero_grad()` does by default) zeroes the slice in place, and
    assigning a tensor copies into it, so the per-parameter gradient views stay linked.
    """

    __module__ = "speedlib.contiguous"  # its public home: tracebacks and pickles name it

    def __new__(cls, data: torch.Tensor | None = None, requires_grad: bool = False):
        # Same signature as nn.Parameter so deepcopy works (the copy is unlinked).
        return super().__new__(cls, data, requires_grad)

    @property
    def grad(self) -> torch.Tensor | None:
        return BASE_GRAD.__get__(self)

    @grad.setter
    def grad(self, value: torch.Tensor | None) -> None:
        linked = self.__dict__.get("_linked_grad")
        if linked is None:  # an unlinked copy behaves like any tensor
            BASE_GRAD.__set__(self, value)
            return
        if value is None:
            linked.zero_()  # one memset; unlinking would silently stop training
        elif value is not linked:
            linked.copy_(value)
        BASE_GRAD.__set__(self, linked)
