"""What ContiguousParams refuses before anything is copied (speedlib/contiguous/checks.py): a
consumed generator, something that is not an iterable of parameters, a lazy or repeated
parameter, bad align_bytes, named and plain parameters mixed, parameters that share memory;
each with a message that says what to pass instead, and what it accepts."""

from __future__ import annotations

import pytest
import torch
from contiguous_bits import assert_same_params, train, twin
from torch import nn

from speedlib import ContiguousParams


def test_a_consumed_parameter_generator_is_named_as_such():
    model = nn.Linear(2, 2)
    params = model.parameters()
    torch.optim.SGD(params, lr=0.1)  # reads the generator to its end
    with pytest.raises(ValueError, match="empty parameter list: the iterator yielded nothing.*already consumed"):
        ContiguousParams(params)
    group = (p for p in model.parameters())
    list(group)
    with pytest.raises(ValueError, match="parameter group 0 has no parameters: .*already consumed"):
        ContiguousParams([{"params": group, "lr": 0.1}])
    with pytest.raises(ValueError, match="empty parameter list$"):  # a list is simply empty
        ContiguousParams([])


def test_bad_input_gives_clear_errors():
    with pytest.raises(ValueError, match="empty parameter list"):
        ContiguousParams([])
    with pytest.raises(ValueError, match="empty parameter list"):
        ContiguousParams(iter([]))
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="all 2 parameters are frozen"):
        ContiguousParams(frozen.parameters())
    lin = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="more than once"):
        ContiguousParams([lin.weight, lin.weight])
    with pytest.raises(TypeError, match="single Parameter"):
        ContiguousParams(lin.weight)
    with pytest.raises(TypeError, match="not a tensor"):
        ContiguousParams([lin.weight, 3])
    params = ContiguousParams(lin.parameters())
    with pytest.raises(ValueError, match="already a flat buffer"):
        ContiguousParams(params.contiguous())
    with pytest.raises(ValueError, match="lazy module"):
        ContiguousParams(nn.LazyLinear(3).parameters())


@pytest.mark.parametrize("parameters,where", [(None, "got None"), (3, "got int"),
                                              ([{"params": None}], "parameter group 0 .*got None")])
def test_something_that_is_not_an_iterable_of_parameters_is_a_clear_type_error(parameters, where):
    with pytest.raises(TypeError, match=rf"{where}.*model\.parameters\(\)"):
        ContiguousParams(parameters)


@pytest.mark.parametrize("align_bytes,error,message", [
    (0, ValueError, "power of two"), (-64, ValueError, "power of two"), (48, ValueError, "power of two"),
    (3, ValueError, "power of two"), (2**36, ValueError, "at most 4096"), (8192, ValueError, "at most 4096"),
    (True, TypeError, "an int, got True"), (64.0, TypeError, "an int, got 64.0"), ("64", TypeError, "an int"),
])
def test_bad_align_bytes_is_refused_before_anything_moves(align_bytes, error, message):
    model = nn.Linear(3, 5)
    before = [p.data_ptr() for p in model.parameters()]
    with pytest.raises(error, match=f"align_bytes must be .*{message}"):
        ContiguousParams(model.parameters(), align_bytes=align_bytes)
    assert [p.data_ptr() for p in model.parameters()] == before  # refused before wrapping anything


@pytest.mark.parametrize("align_bytes", [1, 2, 16, 64, 4096])
def test_every_allowed_align_bytes_aligns_offsets_within_the_buffer(align_bytes):
    model = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 7).half(), nn.Linear(7, 2))  # odd sizes, two dtypes
    params = ContiguousParams(model.parameters(), align_bytes=align_bytes)
    for p in model.parameters():
        buf = params.param_buffers[(p.device, p.dtype)]
        offset = p.data_ptr() - buf.data_ptr()
        assert offset % max(align_bytes, p.element_size()) == 0


def test_mixing_named_and_plain_parameters_is_a_clear_error():
    lin = nn.Linear(2, 2)
    other = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"the parameter list mixes \(name, parameter\) pairs with bare parameters"):
        ContiguousParams([("weight", lin.weight), lin.bias])
    with pytest.raises(TypeError, match="parameter group 1 mixes"):
        ContiguousParams([{"params": lin.named_parameters()}, {"params": [other.weight, ("bias", other.bias)]}])
    with pytest.raises(TypeError, match=r"not a \(name, parameter\) pair"):
        ContiguousParams([(lin.weight, "weight")])


def _tied_by_memory(kind: str) -> list[nn.Parameter]:
    a = nn.Parameter(torch.randn(4, 3))
    if kind == "alias":  # tied weights built as two Parameter objects over one tensor
        return [a, nn.Parameter(a.data)]
    if kind == "row-view":
        return [a, nn.Parameter(a.data[1])]
    if kind == "transposed":
        return [nn.Parameter(a.data.t()), a]
    return [a, nn.Parameter(a.data, requires_grad=False)]  # "frozen-alias": it would stop seeing a's updates


@pytest.mark.parametrize("kind", ["alias", "row-view", "transposed", "frozen-alias"])
def test_parameters_sharing_memory_are_refused_instead_of_untied(kind):
    tied = _tied_by_memory(kind)
    before = [p.data_ptr() for p in tied]
    with pytest.raises(ValueError, match=r"share memory.*copying them into the flat buffer would untie them"):
        ContiguousParams(tied)
    assert [p.data_ptr() for p in tied] == before  # still tied: nothing was moved
    named = [("encoder.weight", tied[0]), ("decoder.weight", tied[1])]
    with pytest.raises(ValueError, match="parameter 'encoder.weight' and parameter 'decoder.weight' share memory"):
        ContiguousParams(named)
    with pytest.raises(ValueError, match="share memory"):  # across groups too
        ContiguousParams([{"params": [tied[0]]}, {"params": [tied[1]], "lr": 0.1}])


def test_disjoint_parameters_of_one_storage_are_wrapped():
    """Parameters that are separate pieces of one tensor (as those of an earlier ContiguousParams
    are) share no element, so copying them apart unties nothing: wrapping them again is the fix
    the conversion and unfreezing messages give."""
    ref, model = twin()
    first = ContiguousParams(model.parameters())
    again = ContiguousParams(model.parameters())
    assert again.buffer_is_valid() and not first.buffer_is_valid()
    train(ref, torch.optim.Adam(ref.parameters(), lr=1e-2))
    train(model, torch.optim.Adam(again.contiguous(), lr=1e-2))
    assert_same_params(ref, model, atol=0, rtol=0)
