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

The package: buffers.py holds ContiguousParams and its flat buffers; checks.py what it accepts
and refuses before anything is copied (with the alignment limits); hooks.py the process-wide
module, optimizer and gradient hooks that see a parameter or gradient leave the buffers;
problems.py the messages that say what moved and how to fix it; flat_parameter.py the type
they all share, FlatParameter, below them so that none imports another in a circle.
"""

from speedlib.contiguous.buffers import ContiguousParams
from speedlib.contiguous.checks import ALIGN_BYTES, MAX_ALIGN_BYTES
from speedlib.contiguous.flat_parameter import FlatParameter, InvalidBufferError

__all__ = ["ContiguousParams", "FlatParameter", "InvalidBufferError", "ALIGN_BYTES", "MAX_ALIGN_BYTES"]
