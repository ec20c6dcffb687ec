"""A checkpointed segment's arguments, results and saved tensors as flat lists.

autograd.Function only tracks tensors passed as its own arguments, so speedlib/checkpoint.py
flattens a segment's arguments and results (torch's pytree, which also flattens dataclass
instances here) and rebuilds them afterwards; and it tells a nondeterministic segment by the
flat log of what each run saved for backward (`_SavedLog`, raising
`NondeterministicSegmentError`); the generators a segment draws from itself are logged in
_checkpoint_generators.py. These need no autograd node, so they live apart from it;
`speedlib.checkpoint` is the module to import, and re-exports the error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

# torch's own checkpoint and torch.compile flatten arguments with it; there is no public twin.
from torch.utils import _pytree as pytree


def _is_plain_dataclass(obj: Any) -> bool:
    """A dataclass instance that torch's pytree does not flatten (not registered with it)."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type) and type(obj) not in pytree.SUPPORTED_NODES


def _flatten(tree: Any) -> tuple[list[Any], Any]:
    """pytree's flatten that also opens dataclass instances.

    torch's checkpoint never flattens (its graph is the segment's own), so a dataclass
    holding tensors just works there; here every tensor must become an input or output of
    the node, and pytree would keep a dataclass whole as one opaque leaf, cutting its
    tensors off the graph. Its fields are flattened instead, in declaration order.
    """
    flat, spec = pytree.tree_flatten(tree, is_leaf=_is_plain_dataclass)
    leaves: list[Any] = []
    inner: list[Any] = []
    for item in flat:
        if _is_plain_dataclass(item):
            names = tuple(f.name for f in dataclasses.fields(item))
            sub_leaves, sub_spec = _flatten([getattr(item, n) for n in names])
            inner.append((type(item), names, sub_spec, len(sub_leaves)))
            leaves.extend(sub_leaves)
        else:
            inner.append(None)
            leaves.append(item)
    return leaves, (spec, tuple(inner))


def _unflatten(leaves: list[Any], spec: Any) -> Any:
    """Inverse of _flatten. A dataclass is rebuilt without calling __init__ or __post_init__
    (its fields already hold what the function made; init=False and frozen fields too)."""
    tree_spec, inner = spec
    items, pos = [], 0
    for node in inner:
        if node is None:
            items.append(leaves[pos])
            pos += 1
            continue
        cls, names, sub_spec, n = node
        obj = cls.__new__(cls)
        for name, value in zip(names, _unflatten(leaves[pos:pos + n], sub_spec), strict=True):
            object.__setattr__(obj, name, value)
        items.append(obj)
        pos += n
    return pytree.tree_unflatten(items, tree_spec)


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.shape), t.dtype, t.device


class NondeterministicSegmentError(RuntimeError):
    """The rerun of a checkpointed segment in backward did not repeat its first run."""

    __module__ = "speedlib.checkpoint"  # its public home: tracebacks and pickles name it


def _nondeterministic(what: str) -> NondeterministicSegmentError:
    return NondeterministicSegmentError(
        f"speedlib.checkpoint: the segment is not deterministic: {what}. The rerun in backward must repeat the "
        "first run, or its gradients belong to another computation. Make the segment depend only on its "
        "arguments, params= and the default RNG (which is restored): no counters or other state that changes "
        "between forward and backward, no random generator of its own.")


class _SavedLog:
    """Shape, dtype and device of every tensor a run saves for backward, in order.

    The first run keeps nothing ("none": the point of checkpointing) unless the segment
    itself needs its graph (it calls autograd.grad: "all"). The rerun keeps values
    ("values"): its graph is only evaluated, never differentiated, so a detached alias of
    a computed tensor serves, and a saved output does not hold its own node in a reference
    cycle (which would leave the rerun's memory to the garbage collector). Comparing the two logs is
    how torch's checkpoint detects a nondeterministic segment.
    """

    def __init__(self, keep: str):
        self.keep, self.meta, self.unpacked_dropped = keep, [], False

    def pack(self, t: torch.Tensor) -> Any:
        self.meta.append(_meta(t))
        if self.keep == "none":
            return None
        # Only a tensor with a history can close a cycle; others stay the same object.
        return t.detach() if self.keep == "values" and t.grad_fn is not None else t

    def unpack(self, packed: Any) -> torch.Tensor:
        if packed is None:  # the segment differentiates its own first run: checkpoint() retries keeping them
            self.unpacked_dropped = True
            raise RuntimeError("speedlib.checkpoint: a tensor the first run did not keep was needed")
        return packed

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def compare(self, first: list[tuple[Any, ...]], metadata: bool = True) -> None:
        """The count always (torch's too); shapes, dtypes and devices unless determinism_check="none"."""
        if len(first) != len(self.meta):
            raise _nondeterministic(f"a different number of tensors was saved during the original forward and "
                                    f"recomputation ({len(first)} in forward, {len(self.meta)} in the rerun)")
        for i, (a, b) in enumerate(zip(first, self.meta, strict=True) if metadata else ()):
            if a != b:
                raise _nondeterministic(f"saved tensor {i} had shape, dtype and device {a} in forward and {b} "
                                        "in the rerun")
