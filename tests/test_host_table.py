"""HostTable (speedlib/transfer/table.py), every backend against plain indexing: gather and scatter,
the duplicate rule (last_write_wins), the input refused and how, forked DataLoader workers, and
tables mapped from .npy files.

The GPU backends (pinned, cupy, uva, device) are skipped without a GPU; what they share with
'pageable' (index checks, the duplicate rule, shapes, dtypes) runs on every machine through
'pageable'. The backends' internals are tested in tests/test_transfer_backends.py.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from embedding_bits import DIM, ROWS
from transfer_bits import ALL, GPU_BACKENDS, _backend_params, _device, _reference, needs_cuda

from speedlib.transfer import HostTable, last_write_wins

# --- the duplicate rule -------------------------------------------------------------------

def _last_wins_by_loop(table: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    out = table.clone()
    for i, v in zip(idx.tolist(), values, strict=True):
        out[i] = v  # Python assignment order: the last occurrence stays
    return out


def test_last_write_wins_keeps_the_last_occurrence():
    idx = torch.tensor([5, 2, 5, 7, 2, 5])
    values = torch.arange(6.0).unsqueeze(1)
    rows, vals = last_write_wins(idx, values)
    assert rows.tolist() == [2, 2, 5, 5, 5, 7]
    assert vals.squeeze(1).tolist() == [4.0, 4.0, 5.0, 5.0, 5.0, 3.0]


def test_last_write_wins_matches_sequential_assignment_on_random_input():
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 50, (2000,), generator=gen)
    values = torch.randn(2000, 3, generator=gen)
    rows, vals = last_write_wins(idx, values)
    got = torch.zeros(50, 3).index_copy_(0, rows, vals)
    assert torch.equal(got, _last_wins_by_loop(torch.zeros(50, 3), idx, values))


def test_last_write_wins_passes_tiny_inputs_through():
    for n in (0, 1):
        idx, values = torch.arange(n), torch.ones(n, 2)
        rows, vals = last_write_wins(idx, values)
        assert rows is idx and vals is values


# --- every backend against plain indexing ---------------------------------------------------

@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_gather_equals_plain_indexing(backend, dtype):
    if backend == "cupy" and dtype == torch.bfloat16:
        pytest.skip("NumPy (and so the cupy backend) has no bfloat16; the constructor's TypeError is tested")
    dev = _device(backend)
    ref = _reference(dtype=dtype)
    table = HostTable.from_tensor(ref, backend=backend, device=dev)
    gen = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 1000, (7, 33), generator=gen)
    for indices in (idx, idx.to(torch.int32), idx.to(dev), idx.sort(dim=1).values):
        out = table.gather(indices)
        assert out.device == dev and out.dtype == dtype and out.shape == (7, 33, 16)
        assert torch.equal(out.cpu(), ref[indices.cpu().long()])


@pytest.mark.parametrize("backend", ALL)
def test_scatter_writes_rows_and_the_last_duplicate_wins(backend):
    dev = _device(backend)
    ref = _reference()
    table = HostTable.from_tensor(ref, backend=backend, device=dev)
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 1000, (4096,), generator=gen)  # about 1,800 of them are repeats
    values = torch.randn(4096, 16, generator=gen)
    table.scatter_(idx, values.to(dev))
    assert torch.equal(table.cpu().cpu(), _last_wins_by_loop(ref, idx, values))
    # ...and from host values, with indices of another shape.
    table.scatter_(idx.reshape(64, 64), values.reshape(64, 64, 16))
    assert torch.equal(table.gather(torch.arange(1000)).cpu(), _last_wins_by_loop(ref, idx, values))


@pytest.mark.parametrize("backend", ALL)
def test_scatter_takes_int32_indices_like_int64(backend):
    """gather accepts int32 indices; every write path must too (index_copy_ takes only int64)."""
    dev = _device(backend)
    gen = torch.Generator().manual_seed(4)
    idx = torch.randint(0, 1000, (8, 16), generator=gen)  # with repeats
    values = torch.randn(8, 16, 16, generator=gen)
    want = _last_wins_by_loop(_reference(), idx.reshape(-1), values.reshape(-1, 16))
    for indices in (idx.to(torch.int32), idx.to(torch.int32).to(dev)):
        table = HostTable.from_tensor(_reference(), backend=backend, device=dev)
        table.scatter_(indices, values)
        assert torch.equal(table.cpu().cpu(), want)


@pytest.mark.parametrize("backend", ALL)
def test_empty_index_gathers_nothing_and_writes_nothing(backend):
    dev = _device(backend)
    table = HostTable.from_tensor(_reference(), backend=backend, device=dev)
    assert table.gather(torch.zeros(0, dtype=torch.long)).shape == (0, 16)
    table.scatter_(torch.zeros(0, dtype=torch.long), torch.zeros(0, 16))
    assert torch.equal(table.cpu().cpu(), _reference())


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("bad", [-1, 1000, 10**9])
def test_out_of_range_raises_index_error_before_writing(backend, bad):
    dev = _device(backend)
    table = HostTable.from_tensor(_reference(), backend=backend, device=dev)
    idx = torch.tensor([0, 1, bad, 2])
    with pytest.raises(IndexError, match=f"index {bad} is out of range for a table of 1000 rows"):
        table.gather(idx)
    with pytest.raises(IndexError, match="out of range"):
        table.scatter_(idx, torch.zeros(4, 16))
    with pytest.raises(IndexError, match="out of range"):
        table.scatter_(idx.to(dev), torch.zeros(4, 16, device=dev))
    assert torch.equal(table.cpu().cpu(), _reference())  # rows 0, 1, 2 were not written either


def test_bad_input_gives_clear_errors():
    table = HostTable.from_tensor(_reference(), backend="pageable", device="cpu")
    with pytest.raises(TypeError, match="int32 or int64, got torch.float32"):
        table.gather(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="int32 or int64, got torch.bool"):
        table.gather(torch.tensor([True]))
    with pytest.raises(TypeError, match="holds torch.float32, got torch.float64 values"):
        table.scatter_(torch.tensor([1]), torch.zeros(1, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"must have shape \(2, 16\), got \(2, 8\)"):
        table.scatter_(torch.tensor([1, 2]), torch.zeros(2, 8))
    with pytest.raises(TypeError, match="values must be a tensor"):
        table.scatter_(torch.tensor([1]), [[0.0] * 16])
    with pytest.raises(TypeError, match="cast explicitly"):
        table.copy_(torch.zeros(2, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="cannot copy"):
        table.copy_(torch.zeros(2, 16), start=999)
    with pytest.raises(TypeError, match="start must be an integer row index, got 1.5"):
        table.copy_(torch.zeros(2, 16), start=1.5)
    with pytest.raises(TypeError, match="start must be an integer row index, got True"):
        table.copy_(torch.zeros(2, 16), start=True)
    with pytest.raises(TypeError, match="src must be a tensor, got list"):
        table.copy_([[0.0] * 16])
    assert torch.equal(table.cpu(), _reference())


@pytest.mark.parametrize("row", [
    pytest.param(lambda: torch.arange(4, dtype=torch.float64), id="tensor-of-another-dtype"),
    pytest.param(lambda: torch.arange(4.0).reshape(1, 4), id="1xdim-tensor"),
    pytest.param(lambda: [0.0, 1.0, 2.0, 3.0], id="list"),
    pytest.param(lambda: (0, 1, 2, 3), id="tuple-of-ints"),
    pytest.param(lambda: np.arange(4, dtype=np.float32), id="ndarray"),
    pytest.param(lambda: np.arange(4, dtype=np.int16), id="int16-ndarray"),
])
def test_fill_takes_a_row_as_a_tensor_a_list_or_an_array(row):
    table = HostTable(3, 4, dtype=torch.float16, backend="pageable", device="cpu")
    assert table.fill_(row()) is table
    assert torch.equal(table.cpu(), torch.arange(4, dtype=torch.float16).expand(3, 4))


def test_fill_with_one_number_sets_every_value_as_tensor_fill_does():
    table = HostTable(3, 4, backend="pageable", device="cpu")
    table.fill_(2.5)
    assert torch.equal(table.cpu(), torch.full((3, 4), 2.5))
    table.fill_(torch.tensor(-1.0))
    assert torch.equal(table.cpu(), torch.full((3, 4), -1.0))


@pytest.mark.parametrize("row,error,message", [
    ([1.0, 2.0], ValueError, r"4 values \(one row\) or one number, got 2 values"),
    (torch.zeros(2, 4), ValueError, r"4 values \(one row\) or one number, got 8 values"),
    ("abc", TypeError, "a row must be a tensor, a list or array of numbers, or a number, got str"),
    ([["a"]] * 4, TypeError, "a row must be .* got list"),
    (None, TypeError, "got NoneType"),
    ([True, False, True, False], TypeError, "got list of torch.bool"),
    (torch.ones(4, dtype=torch.complex64), TypeError, "got Tensor of torch.complex64"),
])
def test_a_bad_fill_row_is_refused_and_writes_nothing(row, error, message):
    table = HostTable.from_tensor(_reference(rows=3, dim=4), backend="pageable", device="cpu")
    with pytest.raises(error, match=message):
        table.fill_(row)
    assert torch.equal(table.cpu(), _reference(rows=3, dim=4))


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        HostTable(10, 4, backend="gpu", device="cpu")
    with pytest.raises(ValueError, match="rows must be a positive int"):
        HostTable(0, 4, backend="pageable", device="cpu")
    with pytest.raises(ValueError, match="dim must be a positive int"):
        HostTable(10, 2.5, backend="pageable", device="cpu")
    with pytest.raises(TypeError, match="not torch.int64"):
        HostTable(10, 4, dtype=torch.int64, backend="pageable", device="cpu")
    for backend in GPU_BACKENDS:
        with pytest.raises(ValueError, match="use 'pageable' on CPUs"):
            HostTable(10, 4, backend=backend, device="cpu")
    with pytest.raises(ValueError, match="2-D"):
        HostTable.from_tensor(torch.zeros(3), backend="pageable", device="cpu")


def test_a_cuda_table_without_cuda_fails_at_construction(monkeypatch):
    """Even 'pageable' (host memory) refuses a CUDA device here, not at its first gather."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="torch sees no CUDA device: use device='cpu'"):
        HostTable(10, 4, backend="pageable", device="cuda")
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        HostTable(10, 4, backend="pageable", device="cuda:0")
    with pytest.raises(RuntimeError, match="backend 'auto' needs CUDA.*use device='cpu'"):
        HostTable(10, 4, device="cuda")


def test_empty_and_float_index_lists_name_the_problem():
    table = HostTable.from_tensor(_reference(), backend="pageable", device="cpu")
    with pytest.raises(ValueError, match=r"indices is an empty list; .*torch.empty\(0, dtype=torch.int64\)"):
        table.gather([])
    with pytest.raises(ValueError, match="indices is an empty tuple"):
        table.scatter_((), torch.zeros(0, 16))
    with pytest.raises(TypeError, match="got torch.float32; floating-point indices are not row numbers"):
        table.gather([1.0, 2.0])
    with pytest.raises(TypeError, match="a tensor or a list of ints, got list"):
        table.gather(["a"])
    assert table.gather(torch.empty(0, dtype=torch.int64)).shape == (0, 16)  # the way to ask for no rows
    assert torch.equal(table.cpu(), _reference())


@needs_cuda
def test_indices_on_another_gpu_are_refused():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    table = HostTable(10, 4, backend="device", device="cuda:0")
    with pytest.raises(ValueError, match="indices are on cuda:1"):
        table.gather(torch.tensor([1], device="cuda:1"))


def test_a_table_refuses_pickling_with_advice():
    table = HostTable(10, 4, backend="pageable", device="cpu")
    with pytest.raises(TypeError, match="send indices to worker processes"):
        pickle.dumps(table)


# --- processes: DataLoader workers --------------------------------------------------------------

class _RowsDataset(torch.utils.data.Dataset):
    """Items are indices, or (with a table) host rows read in the worker."""

    def __init__(self, table: HostTable | None = None):
        self.table = table

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        idx = i * 7 % 1000
        return torch.tensor(idx) if self.table is None else self.table.cpu()[idx].clone()


@pytest.mark.parametrize("backend", ALL)
def test_dataloader_workers_leave_the_table_working(backend):
    """Workers fork after CUDA is up; the table must work while and after they run."""
    dev = _device(backend)
    ref = _reference()
    table = HostTable.from_tensor(ref, backend=backend, device=dev)
    table.gather(torch.tensor([1, 2]))  # CUDA (where used) is initialised before the workers fork
    loader = torch.utils.data.DataLoader(_RowsDataset(), batch_size=16, num_workers=2)
    rows = torch.cat([table.gather(idx) for idx in loader])
    assert torch.equal(rows.cpu(), ref[torch.arange(64) * 7 % 1000])
    assert torch.equal(table.gather(torch.arange(1000)).cpu(), ref)


@pytest.mark.parametrize("backend", _backend_params(["pageable", "pinned"]))
def test_dataloader_workers_read_rows_of_a_table_in_plain_memory(backend):
    """pageable and pinned keep the table in ordinary memory, which forked workers can read."""
    ref = _reference()
    table = HostTable.from_tensor(ref, backend=backend, device=_device(backend))
    table.gather(torch.tensor([1, 2]))
    loader = torch.utils.data.DataLoader(_RowsDataset(table), batch_size=16, num_workers=2)
    assert torch.equal(torch.cat(list(loader)), ref[torch.arange(64) * 7 % 1000])
    assert torch.equal(table.gather(torch.arange(1000)).cpu(), ref)


# --- memory-mapped tables -------------------------------------------------------------------

def test_from_file_takes_an_open_memmap_without_copying(tmp_path):
    path = tmp_path / "emb.npy"
    np.save(path, _reference(ROWS, DIM).numpy())
    mapped = np.load(path, mmap_mode="r+")
    table = HostTable.from_file(mapped, backend="pageable", device="cpu")
    table.scatter_(torch.tensor([3, 3]), torch.stack([torch.zeros(DIM), torch.ones(DIM)]))
    assert (mapped[3] == 1).all()  # the write went into the caller's mapping itself
    assert torch.equal(table.gather(torch.tensor([3])), torch.ones(1, DIM))
    assert "file=" in repr(table)


def test_from_file_refuses_bad_files_and_backends(tmp_path):
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((4, 3), dtype=np.float32))
    cases = [
        (tmp_path / "missing.npy", {}, FileNotFoundError, "no file .*open_memmap"),
        (np.zeros((4, 3), dtype=np.int64), {}, TypeError, "path to a .npy file or a numpy.memmap"),
        (good, {"mode": "w+"}, ValueError, "mode must be 'r\\+'"),
        (good, {"backend": "uva"}, ValueError, "only 'auto', 'pageable' or 'pinned' can map a file"),
        (good, {"backend": "device"}, ValueError, "only 'auto', 'pageable' or 'pinned' can map a file"),
    ]
    for name, array in [("ints", np.zeros((4, 3), dtype=np.int64)), ("cube", np.zeros((2, 2, 2), dtype=np.float32)),
                        ("fortran", np.asfortranarray(np.zeros((4, 3), dtype=np.float32))),
                        ("bigendian", np.zeros((4, 3), dtype=">f4")), ("objects", np.array([[None]], dtype=object))]:
        np.save(tmp_path / f"{name}.npy", array)
    np.savez(tmp_path / "two.npz", a=np.zeros((2, 2)), b=np.zeros((2, 2)))
    cases += [
        (tmp_path / "ints.npy", {}, TypeError, "holds native-endian float16, float32 or float64, not int64"),
        (tmp_path / "bigendian.npy", {}, TypeError, "native-endian"),
        (tmp_path / "cube.npy", {}, ValueError, "2-D"),
        (tmp_path / "fortran.npy", {}, ValueError, "C-contiguous"),
        (tmp_path / "objects.npy", {}, ValueError, "not a .npy array of numbers"),
        (tmp_path / "two.npz", {}, ValueError, "not a single .npy array"),
    ]
    for file, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            HostTable.from_file(file, **{"backend": "pageable", "device": "cpu", **kwargs})
    assert HostTable.from_file(good, backend="pageable", device="cpu").shape == (4, 3)


def test_a_table_larger_than_memory_is_a_memory_error_that_says_what_to_do():
    """torch's allocator says only how many bytes it could not get, and nothing of the table."""
    with pytest.raises(MemoryError, match=r"a 1000000000000 x 1000000 torch.float32 table needs .* GiB.*from_file"):
        HostTable(10**12, 10**6, backend="pageable", device="cpu")
