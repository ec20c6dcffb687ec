"""The host-gather roofline (benchmarks/bench_transfer.py `Roofline`, `RooflineHypotheses`):
its points (one axis at a time around the suite's), the bus-bytes model, the zipf order, the
skip on CPUs, and its measuring path rehearsed on the CPU with stand-ins for what needs a GPU
(the copy floor, pinned memory); on a GPU, every variant at a small point."""

from __future__ import annotations

import functools
import math
import types

import pytest
import torch
from transfer_bits import needs_cuda, needs_huge_pages

from benchmarks import bench_transfer as bench
from speedbench import CHECKOUT, measure
from speedbench.chunks import how_to_measure, load_chunks
from speedlib.transfer import HostTable

HAS_CUDA = torch.cuda.is_available()
DEFAULT = (512, 131072, 5_120_000_000, "random")
TRACKS = ("track_roofline_gather", "track_roofline_scatter", "track_roofline_gather_bandwidth",
          "track_roofline_scatter_bandwidth", "track_roofline_h2d_floor", "track_roofline_d2h_floor",
          "track_roofline_gather_bus_bytes", "track_roofline_scatter_bus_bytes")


def test_every_point_moves_one_axis_from_the_suites_point_and_says_where():
    assert bench.roofline_point(bench.DEFAULT_POINT) == DEFAULT
    moved = {}
    for name in bench.ROOFLINE_POINTS[1:]:
        point = bench.roofline_point(name)
        axes = [i for i in range(4) if point[i] != DEFAULT[i]]
        assert len(axes) == 1, name
        moved.setdefault(name.split()[0], []).append(point[axes[0]])
    assert moved == {"row": [64, 256, 4096], "batch": [1024, 1048576], "table": [1e9, 40e9],
                     "order": ["sorted", "zipf"]}
    assert set(bench.HYPOTHESIS_POINTS) <= set(bench.ROOFLINE_POINTS)
    with pytest.raises(ValueError, match="no roofline point 'rows 64 B'"):
        bench.roofline_point("rows 64 B")


def test_the_bytes_a_row_costs_on_the_bus():
    # the GPU's reads: the 32-byte sectors a row touches and its 8-byte index; write-back: the sectors
    assert [bench.bus_bytes("uva", "gather", w) for w in (64, 512, 4096)] == [72, 520, 4104]
    assert bench.bus_bytes("uva", "scatter", 64) == 64
    # whole lines: a 64-byte row costs a line; a 96-byte row at offsets 0, 32, 64, 96 costs 1, 1, 2, 2 lines
    assert bench.bus_bytes("lines", "gather", 64) == 136 and bench.bus_bytes("lines", "gather", 96) == 1.5 * 128 + 8
    assert bench.bus_bytes("lines", "scatter", 64) == 64  # write-back never reads lines
    assert bench.touched_bytes(24, 32) == 48  # 24-byte rows straddle two sectors half the time
    assert bench.bus_bytes("pinned", "gather", 64) == 64  # packed on the CPU, carried in one bulk copy
    assert bench.bus_bytes("split", "gather", 512, share=0.25) == 0.25 * 512 + 0.75 * 520


def test_zipf_indices_are_popular_rows_scattered_over_the_table_and_repeatable():
    rows, batch = 100_000, 50_000
    idx = bench.roofline_indices("zipf", rows, batch)
    assert idx.dtype == torch.int64 and idx.shape == (batch,) and 0 <= idx.min() and idx.max() < rows
    assert torch.equal(idx, bench.roofline_indices("zipf", rows, batch))  # the same draw every run
    counts = torch.bincount(idx, minlength=rows)
    top = counts.max().item() / batch
    expected = 1 / (torch.arange(1, rows + 1, dtype=torch.float64) ** -bench.ZIPF_EXPONENT).sum().item()
    assert top == pytest.approx(expected, rel=0.1)  # the hottest row is rank 1's share
    assert counts.argmax().item() > 100  # ... but not row 0: ranks are scattered
    assert idx.unique().numel() < 0.6 * batch  # many repeats
    plain = bench.roofline_indices("random", rows, batch)
    assert torch.equal(bench.roofline_indices("sorted", rows, batch), plain.sort().values)
    with pytest.raises(ValueError, match="order must be random, sorted or zipf"):
        bench.roofline_indices("hot", rows, batch)


def test_a_table_the_host_cannot_hold_is_a_skip_saying_how_much(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       134217728 kB\nMemAvailable:   62500000 kB\n")  # 64 GB available
    bench._room_for("uva", 40_000_000_000, str(meminfo))  # 40 GB fits
    with pytest.raises(NotImplementedError, match=r"a 40 GB table of torch_pinned needs 68\.7 GB of host memory; "
                                                  r"64\.0 GB is available here"):
        bench._room_for("torch_pinned", 40_000_000_000, str(meminfo))  # torch's allocator: 64 GiB
    bench._room_for("torch_pinned", 40_000_000_000, str(tmp_path / "absent"))  # unknown: let the allocation say


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_on_a_cpu_every_variant_and_point_is_a_skip_and_builds_nothing(monkeypatch):
    monkeypatch.setattr(bench, "_roofline_storage", lambda *a: pytest.fail("a table was built on a CPU"))
    monkeypatch.setattr(bench.common, "_release", lambda: None)  # a full gc after each skip: seconds in a test process
    for cls in (bench.Roofline, bench.RooflineHypotheses):
        cache = cls().measure_all()
        variants, points = cls.params
        for variant in variants:
            for point in points:
                assert cache[(variant, point)][0] == "skip"
                assert "measured on GPUs only" in cache[(variant, point)][1]
                assert all(math.isnan(getattr(cls(), track)(cache, variant, point)) for track in TRACKS)


def test_each_roofline_class_has_a_chunk_of_its_own():
    """Two chunks: each builds tables up to 40 GB for minutes, and a chunk killed at its limit
    saves nothing, so a slot that runs out in the second keeps the first."""
    assert how_to_measure("bench_transfer.Roofline.") == "speedlib run --chunk transfer-roofline"
    assert how_to_measure("bench_transfer.RooflineHypotheses.") == "speedlib run --chunk transfer-hypotheses"
    # the paired gather is the at-a-glance transfer row's figure, so a slot's headline measures it
    assert how_to_measure("bench_transfer.Transfer.") == "speedlib run --chunk headline-transfer"
    names = [c.name for c in load_chunks(CHECKOUT)]
    assert names.index("transfer-roofline") + 1 == names.index("transfer-hypotheses") < names.index("transfer-parallel")


# --- the measuring path, rehearsed on the CPU ------------------------------------------------------

class _Event:
    def record(self):
        self.recorded = True

    def synchronize(self):
        assert self.recorded


class _Stream:
    def synchronize(self):
        pass


def _unpinned(make):
    return lambda *shape, pin_memory=False, **kw: make(*shape, **kw)


@pytest.fixture
def rehearsal(monkeypatch):
    """The roofline's measuring path on the CPU: the GPU-only guard lifted, fixed copy floors
    (25 GB/s host->device, 20 device->host), every point at a thousandth of its table and a
    256th of its batch, torch_pinned's pinning stood in, and every 'uva' table a pageable one
    (their kernels have tests of their own), three timed calls where a GPU takes twenty;
    returns the tables built, (variant, rows, dim, batch)."""
    built = []
    fake_torch = types.SimpleNamespace(zeros=_unpinned(torch.zeros), empty=_unpinned(torch.empty),
                                       index_select=torch.index_select,
                                       cuda=types.SimpleNamespace(Event=_Event, current_stream=_Stream))

    class Unpinned(bench._TorchPinned):
        def __init__(self, rows, dim, dev, batch):
            built.append(("torch_pinned", rows, dim, batch))
            self.torch, self.device, self.copied = fake_torch, dev, None
            self.table, self.buffer = torch.zeros(rows, dim), torch.empty(batch, dim)

    real_storage, real_point = bench._roofline_storage, bench.roofline_point

    def storage(variant, rows, dim, dev, batch):
        if variant == "torch_pinned":
            return real_storage(variant, rows, dim, dev, batch)  # the frozen baseline, its pinning stood in
        built.append((variant, rows, dim, batch))
        return HostTable(rows, dim, device="cpu", backend="auto" if variant == "auto" else "pageable")

    def small(name):
        row, batch, table, order = real_point(name)
        return row, max(1, batch // 256), table // 1000, order

    def floor(dev, direction, pinned):
        assert pinned, "the floor is the pinned copy"
        return {"h2d": 25e9, "d2h": 20e9}[direction]

    monkeypatch.setattr(bench, "roofline_point", small)
    monkeypatch.setattr(bench, "_median_seconds", functools.partial(bench._median_seconds, samples=3))
    monkeypatch.setattr(bench, "_TorchPinned", Unpinned)
    monkeypatch.setattr(bench, "_roofline_storage", storage)
    monkeypatch.setattr(bench.common, "gpu_only", lambda what: None)
    monkeypatch.setattr(bench.common, "_release", lambda: None)  # a full gc after each point: seconds in a test process
    monkeypatch.setattr(measure, "host_copy_bandwidth", floor)
    return built


@pytest.mark.skipif(HAS_CUDA, reason="rehearses the GPU path with CPU stand-ins")
def test_the_roofline_measures_every_point_building_one_table_per_shape(rehearsal, capsys):
    roofline = bench.Roofline()
    cache = roofline.measure_all()
    assert not bench._roofline_tables  # the last table went with the class's measurement
    # (rows, dim): the suite's shape for five points, then three row widths and two table sizes
    shapes = [(10_000, 128), (80_000, 16), (20_000, 64), (1250, 1024), (1953, 128), (78_125, 128)]
    for variant in ("torch_pinned", "uva", "auto"):
        mine = [b[1:] for b in rehearsal if b[0] == variant]
        # one table per shape, in the points' order; torch_pinned's buffer holds the shape's largest batch
        assert [(rows, dim) for rows, dim, _ in mine] == shapes, variant
        assert mine[0][2] == 4096 and all(batch == 512 for _, _, batch in mine[1:])
    for variant in bench.ROOFLINE_VARIANTS:
        for point in bench.ROOFLINE_POINTS:
            status, got = cache[(variant, point)]
            assert status == "ok", (variant, point, got)
            row = bench.roofline_point(point)[0]
            gather = roofline.track_roofline_gather(cache, variant, point)
            gbps = roofline.track_roofline_gather_bandwidth(cache, variant, point)
            assert gather == pytest.approx(100 * gbps / 25) and gbps > 0
            assert roofline.track_roofline_h2d_floor(cache, variant, point) == 25
            scatter = roofline.track_roofline_scatter(cache, variant, point)
            assert scatter == pytest.approx(100 * roofline.track_roofline_scatter_bandwidth(cache, variant, point) / 20)
            assert roofline.track_roofline_d2h_floor(cache, variant, point) == 20
            # the model: torch_pinned and a CPU 'auto' (pageable: packed on the CPU) move the row itself
            expected = row if variant != "uva" else row + 8
            assert roofline.track_roofline_gather_bus_bytes(cache, variant, point) == expected
            assert roofline.track_roofline_scatter_bus_bytes(cache, variant, point) == row
    err = capsys.readouterr().err
    assert "Roofline auto at order zipf: " in err and "% of the batch's rows distinct" in err


@pytest.mark.skipif(HAS_CUDA, reason="rehearses the GPU path with CPU stand-ins")
def test_the_hypotheses_are_measured_beside_the_plain_uva_at_their_points(rehearsal):
    hypotheses = bench.RooflineHypotheses()
    cache = hypotheses.measure_all()
    assert all(status == "ok" for status, _ in cache.values() if status != "skip") and not bench._roofline_tables
    assert {b[0] for b in rehearsal} == set(bench.HYPOTHESES)
    assert len(rehearsal) == len(bench.HYPOTHESES) * len(bench.HYPOTHESIS_POINTS)  # no two points share a shape
    for point in bench.HYPOTHESIS_POINTS:
        row = bench.roofline_point(point)[0]
        assert hypotheses.track_roofline_gather_bus_bytes(cache, "uva_lines", point) == \
            bench.bus_bytes("lines", "gather", row)
        assert hypotheses.track_roofline_gather_bus_bytes(cache, "uva_2m", point) == row + 8


def test_the_hypotheses_are_the_uva_backends_options_and_skip_where_a_commit_lacks_them(monkeypatch):
    assert bench.HYPOTHESES["uva"] == {} and bench.HYPOTHESES["uva_2m"] == {"huge_pages": True}
    made = []

    def old_host_table(rows, dim, *, dtype=None, backend="auto", device=None, sort_indices=False):
        made.append(backend)

    monkeypatch.setattr(bench.common, "technique", lambda name: types.SimpleNamespace(HostTable=old_host_table))
    with pytest.raises(NotImplementedError, match="this commit's HostTable has no whole_lines option"):
        bench._roofline_storage("uva_lines", 10, 4, torch.device("cpu"), 2)
    bench._roofline_storage("uva_sorted", 10, 4, torch.device("cpu"), 2)
    assert made == ["uva"]


# --- on a GPU: every variant at a small point --------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("cls", [bench.Roofline, bench.RooflineHypotheses], ids=lambda c: c.__name__)
def test_every_roofline_variant_measures_on_a_gpu_at_a_small_point(cls, monkeypatch):
    """Before a slot spends minutes on the chunk: every variant builds, gathers and writes back at
    a point a thousandth of the suite's table (the huge-page table where the host gives them)."""
    real, copy = bench.roofline_point, measure.host_copy_bandwidth
    monkeypatch.setattr(bench, "roofline_point", lambda name: (lambda r, b, t, o: (r, b // 64, t // 1000, o))(
        *real(name)))
    # seconds, not a minute, in the slot's GPU tests: a 4 MiB floor copy, three timed calls
    monkeypatch.setattr(measure, "host_copy_bandwidth", functools.partial(copy, nbytes=1 << 22, repeats=2))
    monkeypatch.setattr(bench, "_median_seconds", functools.partial(bench._median_seconds, samples=3))
    variants, points = cls.params
    cache = cls().measure_all()
    for variant in variants:
        for point in points:
            status, got = cache[(variant, point)]
            if variant == "uva_2m" and status == "skip":
                assert "transparent huge pages are off" in got
                continue
            assert status == "ok", (variant, point, got)
            assert 0 < got["gather"] and 0 < got["scatter"] and got["h2d_floor"] > 1 and got["d2h_floor"] > 1


@needs_cuda
@needs_huge_pages
def test_the_roofline_huge_page_variant_builds_its_table_in_2mib_pages():
    table = bench._roofline_storage("uva_2m", 4096, 128, torch.device("cuda", torch.cuda.current_device()), 64)
    assert table.options == {"huge_pages": True} and table.cpu().data_ptr() % (2 << 20) == 0
