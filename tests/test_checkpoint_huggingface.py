"""speedlib's checkpoint inside a Hugging Face model (docs/huggingface.md): a small Llama built
from a config (no weights downloaded) trains as without checkpointing and as under
torch.utils.checkpoint."""

from __future__ import annotations

import warnings

import pytest
import torch

from speedlib.checkpoint import checkpoint

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")


def _model():
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      attention_dropout=0.2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.config.use_cache = False
    model.train()
    return model


def _grads(how: str) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    model = _model()
    calls = []

    def speedlib_checkpoint(function, *args, **kwargs):
        calls.append(function)
        return checkpoint(function, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames it activation_checkpointing_enable
        if how != "none":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if how == "speedlib":  # what docs/huggingface.md says to add
            model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=speedlib_checkpoint)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)  # attention dropout draws from the default generator
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], len(calls)


def test_a_small_llama_trains_under_speedlibs_checkpoint_as_without():
    loss, expected, _ = _grads("none")
    torch_loss, torch_grads, _ = _grads("torch")
    ours_loss, ours, calls = _grads("speedlib")
    assert calls == 2  # one per decoder layer: speedlib's function did the checkpointing
    assert torch.equal(ours_loss, loss) and torch.equal(torch_loss, loss)
    assert all(g is not None for g in ours)
    for a, b, c in zip(ours, expected, torch_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6)
