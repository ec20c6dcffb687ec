"""ContiguousParams' diagnosis: what moved a parameter or its gradient out of the flat buffers
(or unfroze one left out of them), said with how to fix it."""

from __future__ import annotations

from torch import nn

from speedlib.contiguous.hooks import FROZEN_IN


class Problems:
    """ContiguousParams' messages; a mixin, it reads the wrapper's slots, frozen parameters and replacement."""

    def problem(self) -> str | None:
        """None while the buffers are valid, else what went wrong and how to fix it."""
        if self._replaced is not None:
            return self._replaced
        moved, new_grad, graph_grad = [], [], []
        for i, s in enumerate(self._slots):
            p = s.param
            if p.data_ptr() != s.data_ptr:
                moved.append(i)
            g = p.grad
            # None (model.zero_grad(), Lightning) is fine: re-attached before the next backward
            # accumulates into it and before the next step.
            if g is not None and g.data_ptr() != s.grad_ptr:
                # backward(create_graph=True) accumulates out of place, and the new gradient
                # is part of the graph wherever it depends on a tensor that requires grad (a
                # trainable layer after it, or a loss that is not linear in its output): that
                # gives it away. Where it does not, the generic message still lists create_graph.
                (graph_grad if g.requires_grad else new_grad).append(i)
        if moved:
            return self._describe_move(moved)
        unfrozen = self._unfrozen()
        if unfrozen is not None:
            return unfrozen
        if graph_grad:
            return (
                f"the .grad of {len(graph_grad)} wrapped parameters was replaced by a tensor that is "
                f"part of the autograd graph (first: {self._name(graph_grad[0])}): "
                "backward(create_graph=True) builds gradients as new graph-connected tensors instead of "
                "accumulating in place, so "
                "they cannot live in the flat gradient buffer. For a gradient penalty, take the "
                "gradients with torch.autograd.grad(..., create_graph=True) and call backward() without "
                "create_graph; an optimizer that needs graph-connected gradients (a Hessian-based one) "
                "must be a per-tensor optimizer on params.original(), not on the flat buffer."
            )
        if new_grad:
            return (
                f"the .grad of {len(new_grad)} wrapped parameters is a new tensor outside the flat "
                f"gradient buffer (first: {self._name(new_grad[0])}), as backward(create_graph=True), "
                "p.grad = tensor, or DistributedDataParallel(gradient_as_bucket_view=True) leave it. "
                "Zero gradients with optimizer.zero_grad() or model.zero_grad() (either set_to_none), "
                "update them in place, backward without create_graph, and use "
                "gradient_as_bucket_view=False with DistributedDataParallel."
            )
        return None

    def _unfrozen(self) -> str | None:
        # Runs before every step: one attribute read per frozen parameter, nothing allocated,
        # while none of them requires grad.
        for p in self._frozen_params:
            if p.requires_grad:
                break
        else:
            return None
        first, count = None, 0
        for p, label in zip(self._frozen_params, self._frozen_labels, strict=True):
            if p.requires_grad and FROZEN_IN.get(p) is self._ref:  # not taken over by a newer wrapper
                count += 1
                if first is None:
                    first = f"{label}, shape {tuple(p.shape)}"
        if first is None:
            return None
        return (
            f"{count} of {self._frozen} parameters that were frozen (requires_grad=False) when "
            f"ContiguousParams was built now require grad (first: {first}). They are not in the flat "
            "buffer, so the optimizer built from contiguous() would never update them. After unfreezing, "
            "build ContiguousParams and the optimizer again (the new wrapper takes over the parameters "
            "given to it; the optimizer state starts afresh), or wrap just the unfrozen parameters in a "
            "new ContiguousParams and pass its contiguous() to optimizer.add_param_group (the state of the "
            "others is kept); or keep such parameters out of ContiguousParams and give them to a "
            "per-tensor optimizer."
        )

    def _name(self, i: int) -> str:
        s = self._slots[i]
        label = f"parameter {s.name!r}" if s.name else f"parameter #{i}"
        return f"{label}, shape {tuple(s.param.shape)}"

    def _describe_move(self, moved: list[int]) -> str:
        s = self._slots[moved[0]]
        p = s.param
        device, dtype = s.key
        if p.dtype != dtype:
            what = f"its dtype changed from {dtype} to {p.dtype} (model.half(), .float() or .to(dtype))"
        elif p.device != device:
            what = f"it moved from {device} to {p.device} (model.cuda(), .cpu() or .to(device))"
        elif tuple(p.stride()) != s.stride:
            what = (f"its strides changed from {s.stride} to {tuple(p.stride())} "
                    "(a memory-format conversion such as model.to(memory_format=torch.channels_last))")
        else:
            what = ("its .data was replaced (p.data = ..., torch.nn.utils.vector_to_parameters, or load_state_dict "
                    "with swapped tensors)")
            return (
                f"{len(moved)} of {len(self._slots)} wrapped parameters no longer live in the flat buffer "
                f"(first: {self._name(moved[0])}): {what}. The optimizer would update a buffer the model "
                "no longer reads. Write values in place instead: under torch.no_grad(), p.copy_(value) for "
                "p.data = value, and for vector_to_parameters(vec, params) copy each slice, "
                "p.copy_(vec[offset:offset + p.numel()].view_as(p)), or copy vec into the flat tensors of "
                "contiguous() when the order and padding match. Then build ContiguousParams and the "
                "optimizer again, as this one lost the parameters."
            )
        return (
            f"{len(moved)} of {len(self._slots)} wrapped parameters no longer live in the flat buffer "
            f"(first: {self._name(moved[0])}): {what}. The optimizer would update a buffer the model "
            "no longer reads. Convert the model first, then create ContiguousParams and the optimizer."
        )

    def _mark_replaced(self, module: nn.Module, name: str) -> None:
        if self._replaced is not None:  # keep the first replacement: it names the cause
            return
        self._replaced = (
            f"parameter {name!r} of a {type(module).__name__} was replaced by a new Parameter "
            "(load_state_dict(..., assign=True) or module.attr = nn.Parameter(...)); the model no "
            "longer uses the flat buffer. Load with assign=False (it copies in place), or create "
            "ContiguousParams and the optimizer after loading."
        )
