"""`ContiguousParams`: the flat buffers, one pair (parameters, gradients) per (device, dtype), the
wrapped parameters and gradients made views of them, and the flat tensors the optimizer steps.

What it fixes and its semantics: the package's docstring (speedlib/contiguous/__init__.py). The
argument checks are in checks.py, the process-wide hooks that keep the buffers valid in
hooks.py, the messages for a broken buffer in problems.py.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch

from speedlib.contiguous.checks import (
    ALIGN_BYTES,
    check_align_bytes,
    check_parameter,
    dense_strides,
    normalise_groups,
    refuse_shared_memory,
    round_up,
    split_names,
)
from speedlib.contiguous.flat_parameter import BASE_GRAD, FlatParameter, InvalidBufferError
from speedlib.contiguous.hooks import FROZEN_IN, OWNER_OF, install_hooks, watch_gradient
from speedlib.contiguous.problems import Problems


class _Slot:
    """Where one parameter lives in the buffers, and the pointers that prove it still does."""

    __slots__ = ("param", "name", "key", "offset", "stride", "data_ptr", "grad_ptr", "grad_view")

    def __init__(self, param: torch.Tensor, name: str | None, offset: int, stride: tuple[int, ...]):
        self.param, self.name, self.offset, self.stride = param, name, offset, stride
        self.key = (param.device, param.dtype)  # the buffer it lives in, and what it was wrapped as
        self.data_ptr = self.grad_ptr = 0
        self.grad_view: torch.Tensor | None = None  # its slice of the gradient buffer, to re-attach

    def detached(self) -> bool:
        """The gradient was set to None while the parameter still lives in the buffer."""
        return self.param.grad is None and self.param.data_ptr() == self.data_ptr


class ContiguousParams(Problems):
    """Keep trainable parameters and their gradients in one flat buffer per (device, dtype).

    `parameters` is what an optimizer takes: an iterable of parameters, of (name, parameter)
    pairs, or of group dicts holding either (per-group options such as lr and weight_decay
    are carried over to `contiguous()`).
    Parameters with `requires_grad=False` are left where they are. Two parameters over the
    same memory (tied weights as two Parameter objects) are refused: copying would untie them.

    `align_bytes`: each parameter starts at a multiple of this many bytes from the start of
    its buffer; a power of two from 1 (no padding, contiguous_params' layout) to 4096 (a
    memory page). The buffer itself is as aligned as torch's allocator makes it (64 bytes on
    CPUs, more on CUDA), so larger values align pointers no further than that on a CPU.
    """

    def __init__(self, parameters: Iterable[torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | Iterable[dict],
                 *, align_bytes: int = ALIGN_BYTES):
        check_align_bytes(align_bytes)
        if isinstance(parameters, ContiguousParams):
            raise TypeError("these parameters are already a ContiguousParams; use it as it is")
        groups, self._grouped = normalise_groups(parameters)
        install_hooks()
        seen: set[int] = set()
        self._groups: list[dict] = []  # original options + the trainable parameters
        self._frozen = 0
        # Frozen when wrapped, and how to name each: owned, though not in the buffer.
        self._frozen_params: list[torch.Tensor] = []
        self._frozen_labels: list[str] = []
        self._ref = weakref.ref(self)
        names: list[str | None] = []  # of the trainable parameters, in slot order
        labelled: list[tuple[torch.Tensor, str]] = []  # every parameter, frozen ones too
        for gi, group in enumerate(groups):
            tensors, group_names = split_names(
                group["params"], f"parameter group {gi}" if self._grouped else "the parameter list")
            trainable = []
            for pi, (p, name) in enumerate(zip(tensors, group_names, strict=True)):
                where = f"parameter {name!r}" if name else f"parameter {pi} of group {gi}"
                check_parameter(p, where)
                if id(p) in seen:
                    raise ValueError(f"{where} appears more than once; each parameter may be wrapped once")
                seen.add(id(p))
                labelled.append((p, where))
                if p.requires_grad:
                    trainable.append(p)
                    names.append(name)
                else:
                    self._frozen += 1
                    label = (f"parameter {name!r}" if name else
                             f"parameter {pi} of group {gi}" if self._grouped else f"parameter {pi} of the list")
                    self._frozen_params.append(p)
                    self._frozen_labels.append(label)
            self._groups.append({**group, "params": trainable})
        if not seen:
            raise ValueError("ContiguousParams got an empty parameter list")
        if not self.num_tensors:
            raise ValueError(f"all {self._frozen} parameters are frozen (requires_grad=False); nothing to optimise")
        refuse_shared_memory(labelled)
        self._replaced: str | None = None
        self._build(align_bytes, names)
        # Only now, once nothing can fail: this wrapper takes over every parameter handed to
        # it, so a previous wrapper stops reporting its frozen ones when they are unfrozen.
        for p in self._frozen_params:
            FROZEN_IN[p] = self._ref

    # -- construction ------------------------------------------------------------------

    def _build(self, align_bytes: int, names: list[str | None]) -> None:
        names_in_order = iter(names)
        sizes: dict[tuple, int] = {}
        self._slots: list[_Slot] = []
        spans: list[dict[tuple, list[int]]] = []  # per group: key -> [start, end)
        for group in self._groups:
            span: dict[tuple, list[int]] = {}
            for p in group["params"]:
                key = (p.device, p.dtype)
                align = max(1, align_bytes // p.element_size())
                offset = round_up(sizes.get(key, 0), align)
                sizes[key] = offset + p.numel()
                self._slots.append(_Slot(p, next(names_in_order), offset, dense_strides(p)))
                span.setdefault(key, [offset, offset])[1] = offset + p.numel()
            spans.append(span)

        # torch.zeros: the alignment padding must be zero and stays zero under any
        # element-wise optimizer (its gradient is never written).
        self.param_buffers = {k: torch.zeros(n, dtype=k[1], device=k[0]) for k, n in sizes.items()}
        self.grad_buffers = {k: torch.zeros(n, dtype=k[1], device=k[0]) for k, n in sizes.items()}

        with torch.no_grad():
            for s in self._slots:
                p = s.param
                view = self.param_buffers[s.key].as_strided(p.shape, s.stride, s.offset)
                gview = self.grad_buffers[s.key].as_strided(p.shape, s.stride, s.offset)
                view.copy_(p)
                if p.grad is not None:
                    gview.copy_(p.grad)  # an existing gradient is kept, not lost
                p.data = view
                p.grad = gview
                s.data_ptr, s.grad_ptr, s.grad_view = p.data_ptr(), gview.data_ptr(), gview
                # Re-wrapping is allowed (it is the fix after a conversion): the previous
                # wrapper, if still alive, now sees moved data and fails its next check.
                OWNER_OF[p] = self._ref
                FROZEN_IN.pop(p, None)
        self._slots_by_key: dict[tuple, list[_Slot]] = {}
        for i, s in enumerate(self._slots):
            self._slots_by_key.setdefault(s.key, []).append(s)
            watch_gradient(s.param, self._ref, i)

        self._flat_groups: list[list[FlatParameter]] = []
        for span in spans:
            flats = []
            for key, (start, end) in span.items():
                flat = FlatParameter(self.param_buffers[key][start:end])
                linked = self.grad_buffers[key][start:end]
                flat.__dict__["_linked_grad"] = linked
                flat.__dict__["_owner"] = self
                BASE_GRAD.__set__(flat, linked)
                flats.append(flat)
            self._flat_groups.append(flats)

    # -- the contiguous_params API ---------------------------------------------------

    def contiguous(self) -> list[torch.Tensor] | list[dict]:
        """What to give the optimizer and clip_grad_norm_: flat tensors (or group dicts)."""
        if not self._grouped:
            return list(self._flat_groups[0])
        return [{**g, "params": list(f)} for g, f in zip(self._groups, self._flat_groups, strict=True)]

    def flat_parameters(self) -> list[FlatParameter]:
        """Every flat tensor, ungrouped: what clip_grad_norm_ takes when groups were given."""
        return [f for flats in self._flat_groups for f in flats]

    def original(self) -> list[torch.Tensor] | list[dict]:
        """The wrapped (trainable) parameters, for operations that need per-tensor shapes."""
        if not self._grouped:
            return list(self._groups[0]["params"])
        return [{**g, "params": list(g["params"])} for g in self._groups]

    def buffer_is_valid(self) -> bool:
        """True while every wrapped parameter and gradient is still a view of the buffers."""
        return self.problem() is None

    def assert_buffer_is_valid(self) -> None:
        """Raise InvalidBufferError saying what invalidated the buffers and how to fix it."""
        problem = self.problem()
        if problem is not None:
            raise InvalidBufferError(problem)

    # -- gradients set to None (model.zero_grad(), PyTorch Lightning) ---------------------

    def reattach_grads(self) -> None:
        """Point every gradient that was set to None back at its zeroed slice of the flat buffer.

        Runs by itself before every optimizer step and before a backward pass accumulates into
        a wrapped parameter whose gradient is None; call it by hand only before reading the
        flat gradients of a step that had no backward pass since the gradients were set to None.
        """
        for key in self._slots_by_key:
            self._reattach_key(key)

    def _reattach_key(self, key: tuple) -> None:
        slots = self._slots_by_key[key]
        detached = [s for s in slots if s.detached()]
        if not detached:
            return
        with torch.no_grad():
            if len(detached) == len(slots):  # model.zero_grad(): one memset, padding included
                self.grad_buffers[key].zero_()
            else:
                for s in detached:
                    s.grad_view.zero_()
            for s in detached:
                s.param.grad = s.grad_view

    def _before_accumulate(self, index: int) -> None:
        # Called by autograd before it accumulates into wrapped parameter `index`. Where its
        # gradient was set to None, every such gradient of the same buffer is re-attached (and
        # zeroed) now, not only this one: a parameter this backward leaves untouched must read
        # zero, not last step's gradient, when the flat tensors are clipped before the step.
        # Only this (device, dtype): autograd may run another device's parameters on another
        # thread at the same moment.
        s = self._slots[index]
        if s.param.grad is None:
            self._reattach_key(s.key)

    # contiguous_params kept its one buffer pair in these private attributes, and its README
    # has users check that the gradient buffer is non-zero or zero_() it by hand. Read-only
    # aliases keep that code working; the original refused more than one (device, dtype).
    @property
    def _param_buffer(self) -> torch.Tensor:
        return self._only_buffer(self.param_buffers, "param_buffers")

    @property
    def _grad_buffer(self) -> torch.Tensor:
        return self._only_buffer(self.grad_buffers, "grad_buffers")

    def _only_buffer(self, buffers: dict[tuple, torch.Tensor], attribute: str) -> torch.Tensor:
        if len(buffers) != 1:
            keys = ", ".join(f"({d}, {t})" for d, t in buffers)
            raise AttributeError(
                f"there are {len(buffers)} flat buffers, one per (device, dtype): {keys}; pick one "
                f"with params.{attribute}[(device, dtype)] (contiguous_params allowed only one)")
        return next(iter(buffers.values()))

    # -- diagnosis -------------------------------------------------------------------

    @property
    def num_tensors(self) -> int:
        return sum(len(g["params"]) for g in self._groups)

    @property
    def num_parameters(self) -> int:
        """Trainable elements (alignment padding not counted)."""
        return sum(p.numel() for g in self._groups for p in g["params"])

    # --- what went wrong: problem, _unfrozen, _name, _describe_move, _mark_replaced (from Problems, problems.py) ---

    def __iter__(self):
        raise TypeError(
            "a ContiguousParams object is not a parameter iterable: pass params.contiguous() to the "
            "optimizer (and params.original() where per-parameter shapes matter)"
        )

    def __repr__(self) -> str:
        parts = [f"{k[0]} {str(k[1]).removeprefix('torch.')}: {b.numel():,} elements"
                 for k, b in self.param_buffers.items()]
        return (f"ContiguousParams({self.num_tensors} tensors, {self.num_parameters:,} parameters, "
                f"{self._frozen} frozen; buffers: {'; '.join(parts)})")
