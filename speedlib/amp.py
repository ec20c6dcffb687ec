"""Precision policies behind one training step, and Tensor Core friendly padding.

  fp32  float32 everywhere with TF32 off for matmuls and cuDNN convolutions: the strict
        baseline every speed-up is measured against
  tf32  float32 tensors, TF32 Tensor Core maths inside matmuls and convolutions (Ampere+;
        10-bit mantissa products, fp32 accumulation)
  fp16  autocast to float16 plus a GradScaler: the loss is multiplied so that small
        gradients survive fp16's narrow range; a step whose gradients overflowed (inf/NaN)
        is skipped and the scale lowered, so one bad batch costs a step, not the model
  bf16  autocast to bfloat16: fp32's exponent range, so no scaler is needed

Policies other than tf32 run with TF32 off, so each comparison changes one thing. Tensor
Cores want matrix dimensions that are multiples of 8 (the Tuning Guide's advice);
`pad_to_multiple` and `pad_linear` do that for sizes that come from data, such as a
vocabulary, without changing what the model computes.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable, Iterator

import torch
from torch import nn

__all__ = ["POLICIES", "Precision", "tf32", "pad_to_multiple", "pad_linear"]

POLICIES = ("fp32", "tf32", "fp16", "bf16")
_AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 on or off for CUDA matmuls and cuDNN convolutions, restored on exit."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# GradScaler keeps its scale as a float32 tensor: a larger one fails at the first step.
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _check_init_scale(init_scale: object) -> None:
    # The scale multiplies the loss and divides the gradients: at 0 every gradient is 0/0,
    # and NaN or inf make every gradient non-finite, so the scaler would skip every step
    # (halving a scale of 0 or inf changes nothing) and the model would never train.
    what = f"init_scale must be a positive finite number (GradScaler's default is 2.0**16), got {init_scale!r}"
    if not isinstance(init_scale, numbers.Real) or isinstance(init_scale, bool):
        raise TypeError(what)
    if not (math.isfinite(init_scale) and 0 < init_scale <= _FLOAT32_MAX):
        raise ValueError(what + " (and at most float32's largest, where the scale is kept)")


class Precision:
    """One precision policy on one device type, with the training step that goes with it.

    >>> precision = Precision("bf16", "cuda")
    >>> loss = precision.step(model, optimizer, loss_fn, x, y)   # no host synchronisation

    For fp16 the GradScaler lives here, so its scale carries across steps; save it with
    `state_dict()`.
    """

    def __init__(self, policy: str, device_type: str, *, init_scale: float = 2.0**16):
        if policy not in POLICIES:
            raise ValueError(f"unknown precision policy {policy!r}; choose one of {', '.join(POLICIES)}")
        if device_type not in ("cuda", "cpu"):
            raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
        _check_init_scale(init_scale)
        self.policy, self.device_type = policy, device_type
        self.scaler = torch.amp.GradScaler(device_type, init_scale=init_scale) if policy == "fp16" else None
        self._scale_before: torch.Tensor | None = None

    def __repr__(self) -> str:
        return f"Precision({self.policy!r}, {self.device_type!r})"

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """Where the forward pass and loss run: TF32 as the policy says, autocast for fp16/bf16."""
        with tf32(self.policy == "tf32"):
            if self.policy in _AUTOCAST:
                with torch.autocast(self.device_type, dtype=_AUTOCAST[self.policy]):
                    yield
            else:
                yield

    def backward_and_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Backward and optimizer step; for fp16, through the scaler (skipping overflowed steps)."""
        with tf32(self.policy == "tf32"):
            if self.scaler is None:
                loss.backward()
                optimizer.step()
                return
            self.scaler.scale(loss).backward()
            # Kept as a tensor: asking whether the step was skipped is what synchronises.
            self._scale_before = self.scaler._scale.clone() if self.scaler._scale is not None else None
            self.scaler.step(optimizer)
            self.scaler.update()

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
             y: torch.Tensor) -> torch.Tensor:
        """zero_grad (set to None), forward + loss under `context()`, backward, step. Returns the loss, detached."""
        optimizer.zero_grad(set_to_none=True)
        with self.context():
            loss = loss_fn(model(x), y)
        self.backward_and_step(loss, optimizer)
        return loss.detach()

    def last_step_skipped(self) -> bool:
        """Whether the scaler skipped the last step because of inf/NaN gradients (synchronises)."""
        if self.scaler is None or self._scale_before is None:
            return False
        # update() lowers the scale exactly when it found inf/NaN (it only grows otherwise).
        return bool(self.scaler._scale < self._scale_before)

    def state_dict(self) -> dict:
        return {"policy": self.policy, "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be the dict that Precision.state_dict() returns, got {type(state).__name__}")
        if state.get("policy") != self.policy:
            raise ValueError(f"state of policy {state.get('policy')!r} cannot load into {self.policy!r}")
        if self.scaler is not None:
            scaler = state.get("scaler")
            # GradScaler would fail on a missing or non-dict entry with a bare KeyError/AttributeError.
            if not isinstance(scaler, dict) or not scaler:
                raise ValueError("state['scaler'] must be the GradScaler state of an fp16 Precision, "
                                 f"got {scaler!r:.80}")
            self.scaler.load_state_dict(scaler)


def pad_to_multiple(n: int, multiple: int = 8) -> int:
    """The smallest multiple of `multiple` that is >= n."""
    for name, value in (("n", n), ("multiple", multiple)):
        # A float would slip through the arithmetic and come back as a float size (2.5 -> 8.0).
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    if n < 0 or multiple < 1:
        raise ValueError(f"need n >= 0 and multiple >= 1, got n={n}, multiple={multiple}")
    return -(-n // multiple) * multiple


def pad_linear(linear: nn.Linear, multiple: int = 8) -> nn.Linear:
    """A copy of `linear` whose in and out features are padded to multiples of `multiple`.

    The extra weights and bias are zero, so `padded(F.pad(x, (0, extra_in)))[..., :out]`
    equals `linear(x)` exactly, and the padded rows get zero gradient from a loss on that
    slice: the logits of a vocabulary of 50257 become a 50264-wide matmul Tensor Cores like.
    """
    out_f, in_f = pad_to_multiple(linear.out_features, multiple), pad_to_multiple(linear.in_features, multiple)
    padded = nn.Linear(in_f, out_f, bias=linear.bias is not None, device=linear.weight.device,
                       dtype=linear.weight.dtype)
    with torch.no_grad():
        padded.weight.zero_()
        padded.weight[: linear.out_features, : linear.in_features] = linear.weight
        if linear.bias is not None:
            padded.bias.zero_()
            padded.bias[: linear.out_features] = linear.bias
    return padded
