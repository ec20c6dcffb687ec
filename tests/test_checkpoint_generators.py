"""The generators a checkpointed segment draws from itself (speedlib/checkpoint/replay.py):
replayed in the rerun, and a segment that drew from none is not watched again."""

import gc
import weakref

import torch
from torch import nn

from speedlib.checkpoint import checkpoint
from speedlib.checkpoint import replay as generators


class Noisy(nn.Module):
    """Dropout-like noise drawn from a generator of its own, only in training mode."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            y = y * torch.bernoulli(torch.full_like(y, 0.5), generator=self.gen)
        return y


def _watched_runs(monkeypatch) -> list[bool]:
    """One entry per first run that was watched (each ends in learn(); a rerun enters a mode of
    the same kind, unwatched, so that compiled code picks the same graph, and is not counted)."""
    runs = []
    learn = generators.GeneratorLog.learn
    monkeypatch.setattr(generators.GeneratorLog, "learn", lambda self: runs.append(True) or learn(self))
    return runs


def test_a_module_that_drew_from_no_generator_of_its_own_is_watched_once_per_training_mode(monkeypatch):
    runs = _watched_runs(monkeypatch)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    x = torch.randn(2, 4, requires_grad=True)
    for _ in range(3):
        checkpoint(model, x).sum().backward()
    assert len(runs) == 1
    model.eval()
    checkpoint(model, x).sum().backward()
    checkpoint(model, x).sum().backward()
    assert len(runs) == 2  # another mode may take another path


def test_a_module_that_draws_from_its_own_generator_is_watched_every_step_and_replayed(monkeypatch):
    runs = _watched_runs(monkeypatch)
    torch.manual_seed(0)
    model = Noisy()
    model.eval()
    x = torch.randn(8, 4, requires_grad=True)
    checkpoint(model, x).sum().backward()  # eval: no noise, learned quiet for eval only
    x.grad = None
    model.train()
    for _ in range(3):
        model.gen.manual_seed(1)
        plain = model(x)
        plain.sum().backward()
        expected = x.grad.clone()
        x.grad = None
        model.gen.manual_seed(1)
        out = checkpoint(model, x)
        out.sum().backward()
        assert torch.equal(out, plain) and torch.equal(x.grad, expected)
        x.grad = None
    assert len(runs) == 1 + 3


def test_one_function_over_different_objects_learns_each_apart(monkeypatch):
    runs = _watched_runs(monkeypatch)
    quiet, noisy = nn.Linear(4, 4), Noisy()
    x = torch.randn(8, 4, requires_grad=True)

    def segment(layer):
        return checkpoint(lambda t: layer(t), x, params=tuple(layer.parameters()))

    for _ in range(2):
        segment(quiet).sum().backward()
        noisy.gen.manual_seed(3)
        plain = noisy(x)
        noisy.gen.manual_seed(3)
        out = segment(noisy)
        out.sum().backward()
        assert torch.equal(out, plain)
    assert len(runs) == 1 + 2  # the quiet layer once; the noisy one every step


def _over(obj):
    return lambda t: obj(t)


def test_a_forgotten_object_is_not_taken_for_a_new_one_at_its_address():
    layer = nn.Linear(4, 4)
    generators.GeneratorLog(_over(layer), None).learn()
    assert generators.GeneratorLog(_over(layer), None).quiet_before()
    assert not generators.GeneratorLog(_over(nn.Linear(4, 4)), None).quiet_before()
    key, _ = generators.GeneratorLog(_over(layer), None)._closure
    stored = generators._QUIET[key]
    del layer, key
    gc.collect()
    newcomer = nn.Linear(4, 4)  # were it at the old address, the dead reference tells them apart
    assert not generators._alive_and_same(stored[0], ("ref", weakref.ref(newcomer), newcomer.training))


def test_a_generator_passed_as_an_argument_is_replayed_even_when_the_segment_was_quiet_before(monkeypatch):
    runs = _watched_runs(monkeypatch)
    layer = nn.Linear(4, 4)
    x = torch.randn(8, 4, requires_grad=True)
    gen = torch.Generator().manual_seed(5)

    def noisy(t, g=None):
        y = layer(t)
        return y if g is None else y * torch.bernoulli(torch.full_like(y, 0.5), generator=g)

    checkpoint(noisy, x, params=tuple(layer.parameters())).sum().backward()  # quiet: learned
    x.grad = None
    gen.manual_seed(5)
    plain = noisy(x, gen)
    plain.sum().backward()
    expected, x.grad = x.grad.clone(), None
    gen.manual_seed(5)
    out = checkpoint(noisy, x, gen, params=tuple(layer.parameters()))
    out.sum().backward()
    assert torch.equal(out, plain) and torch.equal(x.grad, expected)
    assert len(runs) == 2
