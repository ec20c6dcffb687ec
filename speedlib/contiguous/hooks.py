"""The process-wide hooks behind `ContiguousParams`: module and optimizer hooks, gradient watches.

A flat buffer is only safe while nothing moves a wrapped parameter or its gradient out of it,
and only hooks see that happen: PyTorch's global ones see a parameter swapped on a module
(load_state_dict(..., assign=True)) and a step of any optimizer holding flat tensors (checked,
with the gradients set to None re-attached, before the step and after its closure), and a
tensor hook per parameter sees a backward about to accumulate into a None gradient. They and
the weak tables that map parameters and optimizers to their wrapper live here, apart from the
buffers in speedlib/contiguous/buffers.py, which imports this module; both take FlatParameter from
speedlib/contiguous/flat_parameter.py. `speedlib.contiguous` is the module to import.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.weak import WeakIdKeyDictionary

from speedlib.contiguous.flat_parameter import FlatOwner, FlatParameter, InvalidBufferError

# -- process-wide hooks ----------------------------------------------------------------
# Installed on the first ContiguousParams. They cost nothing for modules and optimizers
# that never touch a flat buffer beyond a dictionary lookup.

OWNER_OF: WeakIdKeyDictionary = WeakIdKeyDictionary()  # wrapped param -> weakref(owner)
# Parameter that was frozen when it was last wrapped -> weakref(that wrapper). A wrapper
# reports such a parameter once it requires grad, unless a later wrapper took it over.
FROZEN_IN: WeakIdKeyDictionary = WeakIdKeyDictionary()
_OWNERS_BY_OPTIMIZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Wrapped param -> the handle of its re-attach hook, so a new wrapper replaces the old one's.
_GRAD_WATCH: WeakIdKeyDictionary = WeakIdKeyDictionary()
_hooks_installed = False


def watch_gradient(param: torch.Tensor, owner_ref: weakref.ref, index: int) -> None:
    """Have autograd re-attach param's gradient before accumulating into it, if it is None.

    A tensor hook runs before AccumulateGrad, which then adds in place into the re-attached
    view. It holds the owner weakly (no reference cycle through the parameter) and is marked
    unserializable so torch.save(model) does not warn that it is not saved.
    """
    @torch.utils.hooks.unserializable_hook
    def before_accumulate(grad: torch.Tensor) -> None:
        owner = owner_ref()
        if owner is not None:
            owner._before_accumulate(index)

    old = _GRAD_WATCH.get(param)
    if old is not None:
        old.remove()
    _GRAD_WATCH[param] = param.register_hook(before_accumulate)


def _on_parameter_registered(module: nn.Module, name: str, param: nn.Parameter) -> None:
    # Called by Module.register_parameter before the new parameter replaces the old one,
    # which is how load_state_dict(assign=True) and attribute assignment swap parameters.
    old = module._parameters.get(name)
    if old is None or old is param:
        return None
    ref = OWNER_OF.get(old)
    owner = ref() if ref is not None else None
    if owner is not None:
        owner._mark_replaced(module, name)
    return None


def _owners_of(optimizer: torch.optim.Optimizer) -> list[FlatOwner]:
    signature = tuple(len(g["params"]) for g in optimizer.param_groups)
    cached = _OWNERS_BY_OPTIMIZER.get(optimizer)
    if cached is not None and cached[0] == signature:
        return cached[1]
    owners: dict[int, FlatOwner] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            owner = p.__dict__.get("_owner") if isinstance(p, FlatParameter) else None
            if owner is not None:
                owners[id(owner)] = owner
    _OWNERS_BY_OPTIMIZER[optimizer] = (signature, list(owners.values()))
    return list(owners.values())


def _prepare_for_update(owners: list[FlatOwner]) -> None:
    for owner in owners:
        owner.reattach_grads()  # a parameter without a gradient since the last zero_grad: zero
        owner.assert_buffer_is_valid()


def _check_before_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple | None:
    owners = _owners_of(optimizer)
    if not owners:
        return None
    _prepare_for_update(owners)
    _check_state_fits(optimizer)
    return _with_checked_closure(owners, args, kwargs)


def _check_state_fits(optimizer: torch.optim.Optimizer) -> None:
    """An optimizer state loaded from another flat layout fails deep in the step ("size of tensor
    a (143) must match ... (163)"); say which layout it came from instead."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p) if isinstance(p, FlatParameter) else None
            for key, value in (state or {}).items():
                if not (torch.is_tensor(value) and value.dim() > 0 and value.numel() != p.numel()):
                    continue
                why = ("it has fewer values, as a state saved without alignment padding has: by "
                       "contiguous_params 1.0.0, or by ContiguousParams(..., align_bytes=1). Build this "
                       "ContiguousParams with align_bytes=1 (the original's layout) to resume it"
                       if value.numel() < p.numel() else
                       "it has more values, as a state saved with alignment padding (the default align_bytes) "
                       "has; build ContiguousParams with the align_bytes it was saved with to resume it")
                raise InvalidBufferError(
                    f"the optimizer's state {key!r} for a flat tensor of contiguous() holds {value.numel()} values "
                    f"where the flat tensor has {p.numel()}: it was saved for another flat layout, and {why} "
                    "(the same parameters in the same order), or start from a fresh optimizer state.")


def _with_checked_closure(owners: list[FlatOwner], args: tuple, kwargs: dict) -> tuple | None:
    """step(closure) runs forward and backward inside the step (PyTorch Lightning always does,
    zeroing gradients there), after this hook: check again once the closure has run."""
    def checked(closure):
        def run():
            loss = closure()
            _prepare_for_update(owners)
            return loss
        return run

    if len(args) > 1 and callable(args[1]):  # args[0] is the optimizer
        return (args[0], checked(args[1]), *args[2:]), kwargs
    if callable(kwargs.get("closure")):
        return args, {**kwargs, "closure": checked(kwargs["closure"])}
    return None


def install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    nn.modules.module.register_module_parameter_registration_hook(_on_parameter_registered)
    register_optimizer_step_pre_hook(_check_before_step)  # may wrap the step's closure
    _hooks_installed = True
