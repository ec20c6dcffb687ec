"""Flat-buffer ("contiguous") parameters: one optimizer kernel instead of one per tensor.

All trainable parameters that share a (device, dtype) are copied into one flat buffer and
turned into views of it; their gradients become views of a second flat buffer. The
optimizer is then given one flat tensor per parameter group, so an element-wise optimizer
(SGD, Adam, AdamW, RMSprop, Adagrad, ...) and `clip_grad_norm_` launch a handful of
kernels however many tensors the model has. Drop-in for `contiguous_params` 1.0.0::

    params = ContiguousParams(model.parameters())   # after model.to(device), before DDP
    optimizer = torch.optim.Adam(params.contiguous(), fused=True)
    ...
    torch.nn.utils.clip_grad_norm_(params.contiguous(), 1.0)
    optimizer.step(); optimizer.zero_grad()

What it fixes in the original on today's PyTorch:

- `optimizer.zero_grad()` sets gradients to None by default since 2.0. The original then
  loses its flat gradient, the optimizer skips it and per-parameter gradients accumulate
  forever while `buffer_is_valid()` says True. Here the flat tensors' `.grad` setter turns
  "set to None" into an in-place zero, so the default loop trains correctly.
- `model.zero_grad()` (set_to_none=True) unlinks each parameter's gradient view, and
  PyTorch Lightning calls it, or the optimizer's, before training and inside every step's
  closure. A None gradient is pointed back at its slice of the flat gradient buffer, zeroed,
  by a tensor hook just before backward accumulates into the parameter (every None one of
  that buffer at once, so one the backward leaves untouched reads zero when the flat tensors
  are clipped), and again before each step and after the step's closure (a buffer no
  backward reached). The hook costs about 0.5 us of host time per parameter per backward.
- Anything that moves a parameter or its gradient out of the buffer (`model.to()`,
  `.half()`, `.cuda()`, channels_last conversion, `load_state_dict(..., assign=True)`,
  `DistributedDataParallel(gradient_as_bucket_view=True)`) is caught with a message that
  says what happened and how to fix it: by `buffer_is_valid()`, and by a check that runs
  before every step of an optimizer holding these buffers (O(tensors) host work, about
  30 us for ResNet-50 on a slow CPU, overlapped with GPU work in training; a frozen
  parameter adds one attribute read), so training fails loudly instead of silently stopping.
- Parameter groups, frozen parameters, several devices or dtypes, channels_last
  parameters and pre-existing gradients are handled.
- A parameter that is frozen (requires_grad=False) when it is wrapped stays out of the
  buffer, so the optimizer never updates it; it is still owned by the wrapper. Unfreezing
  it later (gradual unfreezing) is caught by the same checks, naming it, instead of
  leaving it silently untrained (the original's optimizer does train it). The fixes:
  build ContiguousParams and the optimizer again after unfreezing (the new wrapper takes
  over the parameters given to it), or wrap just the unfrozen parameters in a new
  ContiguousParams and add its contiguous() with `optimizer.add_param_group` (the other
  parameters keep their optimizer state), or keep such parameters out of ContiguousParams
  and give them to a per-tensor optimizer. (The original copies frozen parameters into its
  buffer, so weight decay moves them there even while they are frozen.)
- `model.named_parameters()` is accepted, alone or inside group dicts, as torch.optim
  accepts it; the original fails on the pairs. The names are only used to say which
  parameter a message is about: `contiguous()` and `original()` return tensors, which
  every optimizer and `clip_grad_norm_` take (a flat tensor has no one name).
- `backward(create_graph=True)` (double backward, gradient penalties) is named as the
  cause when it replaces gradients: it builds them out of place, as tensors connected to
  the graph, so they cannot live in the flat buffer.
- `_param_buffer` and `_grad_buffer`, the original's attributes its README has users
  inspect or `zero_()`, still work (read-only) while there is one (device, dtype).

What else differs from the original, and what replaces its attributes:
docs/contiguous-params-migration.md.

Not caught: conversions that give the module brand-new Parameter objects without
registering them (`torch.__future__.set_overwrite_module_params_on_conversion(True)`, or
moving to devices such as meta whose tensors cannot share a type with CPU ones); the old
parameters stay valid views, so nothing can be seen from them. Convert first, then wrap.
Nor is a frozen parameter that is swapped for a new Parameter (`load_state_dict(...,
assign=True)`) and then unfrozen: the wrapper never saw the new one.

Semantics to know: a parameter that receives no gradient in a step has a zero gradient
here (as with `zero_grad(set_to_none=False)`), so Adam's momentum and weight decay still
move it, where a per-tensor optimizer would skip it. That includes a parameter that was
trainable when it was wrapped and is frozen later with requires_grad_(False): it stays in
the buffer with a zero gradient, so Adam's momentum keeps moving it until it decays, and
weight decay for as long as it is frozen. This is not reported: freezing for a while (a
GAN's discriminator during the generator's step) is legitimate, and a per-tensor optimizer
does the same under `zero_grad(set_to_none=False)`. To stop it moving, build
ContiguousParams and the optimizer again after freezing; the new wrapper leaves it out.
Optimizers that need per-tensor shapes or norms (LAMB, LARS, Adafactor, Shampoo) must use
`original()`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch

# Three parts live in private modules, each readable on its own: the argument checks
# (speedlib/_contiguous_checks.py, with the alignment limits), the process-wide module,
# optimizer and gradient hooks with their weak tables (_contiguous_hooks.py), and the messages
# that say what moved out of the buffers (_contiguous_problems.py); the type they all
# share, FlatParameter, is below them (_flat_parameter.py). This module keeps the
# buffers and stays the technique's one import.
from speedlib._contiguous_checks import (
    ALIGN_BYTES,
    MAX_ALIGN_BYTES,  # noqa: F401 - align_bytes' upper limit, public beside ALIGN_BYTES on the technique's one import
    _check_align_bytes,
    _check_parameter,
    _dense_strides,
    _normalise_groups,
    _refuse_shared_memory,
    _round_up,
    _split_names,
)
from speedlib._contiguous_hooks import _FROZEN_IN, _OWNER_OF, _install_hooks, _watch_gradient
from speedlib._contiguous_problems import _Problems
from speedlib._flat_parameter import _BASE_GRAD, FlatParameter, InvalidBufferError

__all__ = ["ContiguousParams", "FlatParameter", "InvalidBufferError"]



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


class ContiguousParams(_Problems):
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
        _check_align_bytes(align_bytes)
        if isinstance(parameters, ContiguousParams):
            raise TypeError("these parameters are already a ContiguousParams; use it as it is")
        groups, self._grouped = _normalise_groups(parameters)
        _install_hooks()
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
            tensors, group_names = _split_names(
                group["params"], f"parameter group {gi}" if self._grouped else "the parameter list")
            trainable = []
            for pi, (p, name) in enumerate(zip(tensors, group_names, strict=True)):
                where = f"parameter {name!r}" if name else f"parameter {pi} of group {gi}"
                _check_parameter(p, where)
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
        _refuse_shared_memory(labelled)
        self._replaced: str | None = None
        self._build(align_bytes, names)
        # Only now, once nothing can fail: this wrapper takes over every parameter handed to
        # it, so a previous wrapper stops reporting its frozen ones when they are unfrozen.
        for p in self._frozen_params:
            _FROZEN_IN[p] = self._ref

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
                offset = _round_up(sizes.get(key, 0), align)
                sizes[key] = offset + p.numel()
                self._slots.append(_Slot(p, next(names_in_order), offset, _dense_strides(p)))
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
                _OWNER_OF[p] = self._ref
                _FROZEN_IN.pop(p, None)
        self._slots_by_key: dict[tuple, list[_Slot]] = {}
        for i, s in enumerate(self._slots):
            self._slots_by_key.setdefault(s.key, []).append(s)
            _watch_gradient(s.param, self._ref, i)

        self._flat_groups: list[list[FlatParameter]] = []
        for span in spans:
            flats = []
            for key, (start, end) in span.items():
                flat = FlatParameter(self.param_buffers[key][start:end])
                linked = self.grad_buffers[key][start:end]
                flat.__dict__["_linked_grad"] = linked
                flat.__dict__["_owner"] = self
                _BASE_GRAD.__set__(flat, linked)
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

    # --- what went wrong: problem, _unfrozen, _name, _describe_move, _mark_replaced (from _Problems) ---

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
