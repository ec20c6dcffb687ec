"""ContiguousParams for contiguous_params' last gaps (issue 43): resuming the original's optimizer
state, and writing parameters with vector_to_parameters; and the import order of its modules."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from speedlib import ContiguousParams, InvalidBufferError

SPEEDLIB = Path(__file__).resolve().parent.parent / "speedlib"


def _net() -> nn.Module:
    # Parameter sizes that are not multiples of 16 floats, so 64-byte padding shows.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad(set_to_none=False)  # the original stops training on None gradients
    model(x).pow(2).sum().backward()
    optimizer.step()


def _saved_state(align_bytes: int | None) -> tuple[dict, dict]:
    """A model's and its Adam's state after two steps, flat as contiguous_params 1.0.0 keeps it
    (align_bytes None) or as ContiguousParams(align_bytes=...) does."""
    model = _net()
    if align_bytes is None:
        original = pytest.importorskip("contiguous_params", reason="contiguous_params is not installed")
        params = original.ContiguousParams(model.parameters())
    else:
        params = ContiguousParams(model.parameters(), align_bytes=align_bytes)
    optimizer = torch.optim.Adam(params.contiguous(), lr=1e-2)
    for seed in range(2):
        _step(model, optimizer, seed)
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())


def test_the_originals_optimizer_state_without_align_bytes_1_says_so():
    model_state, optimizer_state = _saved_state(None)
    model = _net()
    model.load_state_dict(model_state)
    optimizer = torch.optim.Adam(ContiguousParams(model.parameters()).contiguous(), lr=1e-2)
    optimizer.load_state_dict(optimizer_state)
    with pytest.raises(InvalidBufferError, match=r"holds 66 values .* contiguous_params 1\.0\.0.*align_bytes=1"):
        _step(model, optimizer, 2)
    # The fix the message names resumes it.
    model.load_state_dict(model_state)
    optimizer = torch.optim.Adam(ContiguousParams(model.parameters(), align_bytes=1).contiguous(), lr=1e-2)
    optimizer.load_state_dict(optimizer_state)
    _step(model, optimizer, 2)


def test_a_padded_state_loaded_without_padding_says_so():
    model_state, optimizer_state = _saved_state(64)
    model = _net()
    model.load_state_dict(model_state)
    optimizer = torch.optim.Adam(ContiguousParams(model.parameters(), align_bytes=1).contiguous(), lr=1e-2)
    optimizer.load_state_dict(optimizer_state)
    with pytest.raises(InvalidBufferError, match="more values, as a state saved with alignment padding"):
        _step(model, optimizer, 2)


def test_vector_to_parameters_names_the_in_place_fix_and_the_fix_keeps_the_buffer():
    model = _net()
    params = ContiguousParams(model.parameters())
    optimizer = torch.optim.SGD(params.contiguous(), lr=0.1)
    vec = torch.arange(66, dtype=torch.float32) / 100
    torch.nn.utils.vector_to_parameters(vec, model.parameters())
    with pytest.raises(InvalidBufferError,
                       match=r"vector_to_parameters.*p\.copy_\(vec\[offset:offset \+ p\.numel\(\)\]"):
        _step(model, optimizer, 0)

    model = _net()
    params = ContiguousParams(model.parameters())
    optimizer = torch.optim.SGD(params.contiguous(), lr=0.1)
    with torch.no_grad():  # the fix, as the message gives it
        offset = 0
        for p in model.parameters():
            p.copy_(vec[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    assert torch.equal(torch.nn.utils.parameters_to_vector(model.parameters()), vec)
    assert params.buffer_is_valid()
    reference = copy.deepcopy(model)
    per_tensor = torch.optim.SGD(reference.parameters(), lr=0.1)
    _step(model, optimizer, 0)
    _step(reference, per_tensor, 0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))


def _package_imports(path: Path) -> set[str]:
    """Every module of speedlib.contiguous that `path` imports, at any depth of the file (inside
    functions and TYPE_CHECKING blocks too: a circle there is still a circle to a reader);
    "__init__" for the package itself."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                 [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            if name == "speedlib.contiguous" or name.startswith("speedlib.contiguous."):
                found.add(name.removeprefix("speedlib.contiguous").lstrip(".") or "__init__")
    return found


def test_the_contiguous_modules_import_one_way():
    """The package's __init__ lists what users import; buffers.py builds on the checks, the hooks
    and the flat parameter; none of those imports buffers.py or the package back, and
    flat_parameter.py, which they all share, imports none of them."""
    graph = {p.stem: _package_imports(p) for p in (SPEEDLIB / "contiguous").glob("*.py")}
    assert graph["buffers"] >= {"checks", "hooks", "flat_parameter", "problems"}
    for part in ("checks", "hooks", "problems", "flat_parameter"):
        assert not graph[part] & {"buffers", "__init__"}, f"{part} imports the buffers or the package back"
    assert graph["flat_parameter"] == set()
