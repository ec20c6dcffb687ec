"""Argument checks and normalisation for `ContiguousParams`, before anything is copied.

What `speedlib.contiguous.ContiguousParams(...)` accepts (an optimizer's parameter iterable,
named parameters, group dicts; `align_bytes`) and refuses (a consumed generator, a lazy or
non-leaf parameter, two parameters over the same memory) is decided here, so that
speedlib/contiguous/buffers.py reads as the flat buffers themselves. Every error says what to pass
instead. Nothing here keeps state; `speedlib.contiguous` is the module to import.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from speedlib.contiguous.flat_parameter import FlatParameter

# cuBLAS, cuDNN and the vectorised element-wise kernels want 16-byte aligned pointers;
# unaligned views would make forward and backward slower and change which kernels run.
# 64 bytes (a cache line) costs at most a few hundred padding elements per model.
ALIGN_BYTES = 64
# A memory page: no kernel wants more, and every parameter costs up to align_bytes of padding,
# so a larger value only wastes memory (2**36 asks the allocator for 64 GiB per parameter).
MAX_ALIGN_BYTES = 4096


def dense_strides(p: torch.Tensor) -> tuple[int, ...]:
    """p's strides if they describe a dense, non-overlapping layout, else contiguous strides.

    Keeping them means a channels_last model stays channels_last once wrapped.
    """
    expected = 1
    for size, stride in sorted(zip(p.shape, p.stride(), strict=True), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return torch.empty(p.shape, device="meta").stride()
        expected *= size
    return tuple(p.stride())


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _consumed_hint(parameters: Any) -> str:
    """Why an iterable came out empty when it is an iterator: model.parameters() is a
    generator, read once, and handing the same one to an optimizer first leaves nothing."""
    if iter(parameters) is not parameters:  # a list or a tuple: really empty
        return ""
    return (": the iterator yielded nothing. A generator such as model.parameters() can be read once, so this "
            "one was most likely already consumed (by an optimizer or an earlier ContiguousParams); call "
            "model.parameters() again or pass a list")


def _as_list(items: Any, expected: str) -> list:
    """list(items), or a TypeError that says what was expected instead of Python's "not iterable"."""
    try:
        iterator = iter(items)
    except TypeError:
        got = "None" if items is None else type(items).__name__
        raise TypeError(f"{expected}; got {got}: pass model.parameters() or a list of parameters") from None
    return list(iterator)


def normalise_groups(parameters: Any) -> tuple[list[dict], bool]:
    """Turn what an optimizer would accept into a list of group dicts; say if groups were given."""
    if isinstance(parameters, torch.Tensor):
        raise TypeError(
            "ContiguousParams takes an iterable of parameters or parameter-group dicts, "
            f"not a single {type(parameters).__name__}; use model.parameters()"
        )
    items = _as_list(parameters, "ContiguousParams takes an iterable of parameters or parameter-group dicts, "
                                 "as an optimizer does")
    if not items:
        raise ValueError("ContiguousParams got an empty parameter list" + _consumed_hint(parameters))
    if all(isinstance(i, dict) for i in items):
        groups = []
        for i, g in enumerate(items):
            if "params" not in g:
                raise ValueError(f"parameter group {i} has no 'params' key")
            ps = g["params"]
            ps = [ps] if isinstance(ps, torch.Tensor) else _as_list(
                ps, f"the 'params' of parameter group {i} must be a parameter or an iterable of parameters")
            if not ps and _consumed_hint(g["params"]):
                raise ValueError(f"parameter group {i} has no parameters{_consumed_hint(g['params'])}")
            groups.append({**g, "params": ps})
        return groups, True
    if any(isinstance(i, dict) for i in items):
        raise TypeError("mix of parameters and parameter-group dicts; pass one or the other")
    return [{"params": items}], False


def split_names(params: list, where: str) -> tuple[list, list[str | None]]:
    """Tensors and their names from what model.parameters() or model.named_parameters() yields."""
    named = [isinstance(p, tuple) for p in params]
    if not any(named):
        return params, [None] * len(params)
    if not all(named):
        raise TypeError(f"{where} mixes (name, parameter) pairs with bare parameters; pass "
                        "model.named_parameters() or model.parameters(), not both")
    for p in params:
        if len(p) != 2 or not isinstance(p[0], str):
            raise TypeError(f"{where} has a tuple that is not a (name, parameter) pair")
    return [p for _, p in params], [n for n, _ in params]


def check_parameter(p: Any, where: str) -> None:
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{where} is a {type(p).__name__}, not a tensor")
    if isinstance(p, nn.parameter.UninitializedParameter):
        raise ValueError(f"{where} is uninitialised (a lazy module): run one forward pass first")
    if not p.is_leaf:
        raise ValueError(f"{where} is not a leaf tensor; optimizers can only update leaves")
    if p.layout != torch.strided:
        raise ValueError(f"{where} has layout {p.layout}; only dense (strided) tensors can be flattened")
    if isinstance(p, FlatParameter):
        raise ValueError(f"{where} is already a flat buffer; wrap the model's parameters, not contiguous()")


def _byte_span(p: torch.Tensor) -> tuple[int, int] | None:
    """[first, end) addresses of the bytes p can reach; None for a tensor without memory."""
    if p.numel() == 0 or p.device.type == "meta":
        return None
    last = sum((n - 1) * s for n, s in zip(p.shape, p.stride(), strict=True))  # strides are never negative
    return p.data_ptr(), p.data_ptr() + (last + 1) * p.element_size()


def refuse_shared_memory(labelled: list[tuple[torch.Tensor, str]]) -> None:
    """Refuse two parameters over the same memory (tied weights as two Parameter objects, or a
    parameter and a view of it) when at least one is trainable: _build copies each trainable
    one into a slot of its own, which would silently untie them.

    Spans, not elements, are compared, so two interleaved strided views (a[::2], a[1::2]) are
    refused although they share no element; disjoint pieces of one tensor, such as the
    parameters of an earlier ContiguousParams, are wrapped as they should be.
    """
    spans = sorted((str(p.device), *span, i) for i, (p, _) in enumerate(labelled)
                   if (span := _byte_span(p)) is not None)
    # Swept by start address, an earlier span overlaps this one iff it ends after this one
    # starts, so the furthest-reaching earlier span is the one to compare with: of any
    # parameter for a trainable one, of a trainable one for a frozen one (frozen parameters
    # are not moved, so two frozen ones stay tied).
    reach: dict[tuple[str, str], tuple[int, int]] = {}  # (device, "any" | "trainable") -> (end, index)
    for device, start, end, i in spans:
        trainable = labelled[i][0].requires_grad
        rival = reach.get((device, "any" if trainable else "trainable"))
        if rival is not None and rival[0] > start:
            raise ValueError(
                f"{labelled[rival[1]][1]} and {labelled[i][1]} share memory (tied weights as two Parameter "
                "objects, or one is a view of the other): copying them into the flat buffer would untie "
                "them, each then training on its own. Tie weights by reusing one Parameter object "
                "(model.parameters() lists it once), or give each tensor memory of its own with .clone() "
                "if they are meant to be separate")
        for kind in ("any", "trainable") if trainable else ("any",):
            if (device, kind) not in reach or reach[(device, kind)][0] < end:
                reach[(device, kind)] = (end, i)


def check_align_bytes(align_bytes: Any) -> None:
    # A power of two, because element sizes are powers of two: then align_bytes is a whole
    # number of elements of every dtype (or smaller than one element, which then sets the
    # alignment: 1 packs the parameters as contiguous_params did).
    if not isinstance(align_bytes, int) or isinstance(align_bytes, bool):
        raise TypeError(f"align_bytes must be an int, got {align_bytes!r} ({type(align_bytes).__name__})")
    if align_bytes < 1 or align_bytes & (align_bytes - 1):
        raise ValueError(f"align_bytes must be a power of two (1, 2, 4, ... {MAX_ALIGN_BYTES}), got {align_bytes}; "
                         f"the default {ALIGN_BYTES} suits every kernel, 1 packs the parameters without padding")
    if align_bytes > MAX_ALIGN_BYTES:
        raise ValueError(f"align_bytes must be at most {MAX_ALIGN_BYTES} (a memory page), got {align_bytes}: "
                         "every parameter may cost that much padding, and no kernel needs more")
